"""bench_infer.py section 5: 64 MiB FP32 in and out of the echo model,
through the daemon, three ways, each against the same-run baseline:

  a. bare copy: numpy copies the 64 MiB once, in this process (the floor:
     an echo has to copy its input to its output at least once);
  b. shared memory: input and output in POSIX shared memory regions
     registered with the daemon (Triton's system shared-memory extension);
     the request and answer are JSON headers only;
  c. binary over the daemon's Unix socket: the 64 MiB go in the request
     body and come back in the answer.

Targets (issue 10 section 4): b <= 2 x a, and c / b >= 5.
"""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import statistics
import time
from pathlib import Path

import numpy as np
from http11 import CLIENTS, Address

SIZE = 64 << 20
COUNT = SIZE // 4
HL = "Inference-Header-Content-Length"


def _region(key: str) -> tuple[mmap.mmap, np.ndarray]:
    fd = os.open(f"/dev/shm{key}", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, SIZE)
        m = mmap.mmap(fd, SIZE)
    finally:
        os.close(fd)
    array = np.frombuffer(m, np.float32)
    array[:] = 0   # touch every page now, not in the first timed request
    return m, array


def bare_copy_ms(src: np.ndarray, repeats: int) -> list[float]:
    dst = np.empty_like(src)
    dst[:] = 0
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        out.append((time.perf_counter() - t) * 1e3)
    return out


async def _timed(address: Address, requests: list[tuple[str, bytes, dict]], repeats: int,
                 check) -> list[float]:
    conn = await CLIENTS["raw"].open(address)
    out = []
    try:
        for i in range(repeats + 1):   # the first is a warmup: the runner maps the regions then
            path, body, headers = requests[0]
            t = time.perf_counter()
            status, answer_headers, answer = await conn.request("POST", path, body, headers)
            elapsed = (time.perf_counter() - t) * 1e3
            if status != 200:
                raise SystemExit(f"5. {path}: HTTP {status}: {bytes(answer[:300])!r}")
            if i == 0:
                check(answer_headers, answer)
            else:
                out.append(elapsed)
    finally:
        await conn.close()
    return out


def run(sock: Path, model: str, repeats: int, verdict) -> None:
    address = Address(unix=str(sock))
    x = (np.arange(COUNT) % 1000 * 0.25).astype(np.float32)
    keys = (f"/cs-bench-{os.getpid()}-in", f"/cs-bench-{os.getpid()}-out")
    (m_in, a_in), (m_out, a_out) = _region(keys[0]), _region(keys[1])
    print(f"5. 64 MiB FP32 in and out of {model!r}, sequential, one connection, {repeats} requests each:", flush=True)
    try:
        a_in[:] = x
        reg = [("POST", f"/v2/systemsharedmemory/region/bench-{io}/register",
                json.dumps({"key": key, "offset": 0, "byte_size": SIZE}).encode())
               for io, key in zip(("in", "out"), keys, strict=True)]

        async def register() -> None:
            conn = await CLIENTS["raw"].open(address)
            try:
                for method, path, body in reg:
                    status, _, answer = await conn.request(method, path, body, {"Content-Type": "application/json"})
                    if status != 200:
                        raise SystemExit(f"5. register: HTTP {status}: {bytes(answer)!r}")
            finally:
                await conn.close()
        asyncio.run(register())
        tensor = {"name": "x_float32", "datatype": "FP32", "shape": [1, COUNT]}
        shm_doc = {"inputs": [{**tensor, "parameters": {"shared_memory_region": "bench-in",
                                                         "shared_memory_byte_size": SIZE}}],
                   "outputs": [{"name": "y_float32", "parameters": {"shared_memory_region": "bench-out",
                                                                    "shared_memory_byte_size": SIZE}}]}
        shm_req = (f"/v2/models/{model}/infer", json.dumps(shm_doc).encode(), {"Content-Type": "application/json"})
        header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": SIZE}}],
                             "outputs": [{"name": "y_float32", "parameters": {"binary_data": True}}]}).encode()
        bin_req = (f"/v2/models/{model}/infer", header + x.tobytes(),
                   {HL: str(len(header)), "Content-Type": "application/octet-stream"})

        def shm_check(headers: dict, answer: bytes) -> None:
            if not np.array_equal(a_out, x):
                raise SystemExit("5. the output region does not hold the input")

        def bin_check(headers: dict, answer: bytes) -> None:
            length = int(headers[HL.lower()])
            if not np.array_equal(np.frombuffer(answer[length:], np.float32), x):
                raise SystemExit("5. the binary answer does not hold the input")

        bare = bare_copy_ms(x, repeats)
        a_out[:] = 0
        shm = asyncio.run(_timed(address, [shm_req], repeats, shm_check))
        binary = asyncio.run(_timed(address, [bin_req], repeats, bin_check))
        med = {k: statistics.median(v) for k, v in (("bare", bare), ("shm", shm), ("bin", binary))}
        for label, key, values in (("a. bare numpy copy", "bare", bare), ("b. shared memory", "shm", shm),
                                   ("c. binary, Unix socket", "bin", binary)):
            print(f"  {label:24} median {med[key]:8.2f} ms, min {min(values):8.2f} ms "
                  f"({SIZE / (1 << 20) / med[key] * 1e3:8.0f} MiB/s one way)")
        over_copy, faster = med["shm"] / med["bare"], med["bin"] / med["shm"]
        print(f"  shared memory / bare copy {over_copy:.2f}; binary / shared memory {faster:.1f}\n")
        verdict("5. 64 MiB shared-memory round trip <= 2 x a bare copy", over_copy <= 2,
                f"{over_copy:.2f} ({med['shm']:.2f} vs {med['bare']:.2f} ms)")
        verdict("5. 64 MiB shared memory >= 5 x faster than binary over the socket", faster >= 5,
                f"{faster:.1f} ({med['bin']:.2f} vs {med['shm']:.2f} ms)")
    finally:
        a_in = a_out = None   # the arrays let go of the mappings before they close
        m_in.close()
        m_out.close()
        for key in keys:
            Path(f"/dev/shm{key}").unlink(missing_ok=True)
