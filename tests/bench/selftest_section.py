"""bench_infer.py section 6: a carton with 10 self-tests of 1 MiB FP32
tensors, run by the daemon (POST .../selftest) against the same ten
requests sent straight to its runner's socket and compared here (the
floor: the same tensors, the same runner, no daemon). Figures, no target.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import numpy as np
import tomli_w
from http11 import CLIENTS, Address

from cartonstore.carton.selftest import compare
from cartonstore.v2.framing import encode_infer_request, parse_infer_response

TESTS = 10
VALUES = (1 << 20) // 4
HL = "Inference-Header-Content-Length"
MAIN = '''
class Echo:
    def infer_with_tensors(self, tensors):
        return {"y": tensors["x"]}


def get_model():
    return Echo()
'''


def carton(dest: Path) -> tuple[Path, list[np.ndarray]]:
    (dest / "model").mkdir(parents=True)
    (dest / "tensor_data").mkdir()
    (dest / "model" / "main.py").write_text(MAIN)
    tensors = [np.random.default_rng(i).standard_normal(VALUES).astype(np.float32) for i in range(TESTS)]
    (dest / "carton.toml").write_text(tomli_w.dumps({
        "spec_version": 1, "model_name": "selftest-bench",
        "input": [{"name": "x", "dtype": "float32", "shape": ["n"]}],
        "output": [{"name": "y", "dtype": "float32", "shape": ["n"]}],
        "self_test": [{"name": f"t{i}", "inputs": {"x": f"@tensor_data/t{i}"}, "expected_out": {"y": f"@tensor_data/t{i}"}}
                      for i in range(TESTS)],
        "runner": {"runner_name": "python", "required_framework_version": ">=3.8", "runner_compat_version": 1,
                   "opts": {"entrypoint_package": "main", "entrypoint_fn": "get_model"}}}))
    (dest / "tensor_data" / "index.toml").write_text(tomli_w.dumps({"tensor": [
        {"name": f"t{i}", "dtype": "float32", "shape": [VALUES], "file": f"t{i}.bin"} for i in range(TESTS)]}))
    for i, t in enumerate(tensors):
        (dest / "tensor_data" / f"t{i}.bin").write_bytes(t.astype("<f4").tobytes())
    return dest, tensors


async def _daemon_run(address: Address, model: str) -> float:
    conn = await CLIENTS["raw"].open(address)
    try:
        t = time.perf_counter()
        status, _, body = await conn.request("POST", f"/v2/models/{model}/selftest", b"{}",
                                             {"Content-Type": "application/json"})
        elapsed = time.perf_counter() - t
    finally:
        await conn.close()
    report = json.loads(body)
    if status != 200 or not report["passed"] or len(report["tests"]) != TESTS:
        raise SystemExit(f"6. selftest: HTTP {status}: {bytes(body[:300])!r}")
    return elapsed * 1e3


async def _direct_run(address: Address, model: str, tensors: list[np.ndarray]) -> float:
    conn = await CLIENTS["raw"].open(address)
    try:
        t = time.perf_counter()
        for x in tensors:   # what a caller without the daemon does: read, send, compare
            parts, length = encode_infer_request({"x": x}, binary=True, binary_outputs=True)
            status, headers, body = await conn.request("POST", f"/v2/models/{model}/infer", b"".join(parts),
                                                       {HL: str(length), "Content-Type": "application/octet-stream"})
            if status != 200:
                raise SystemExit(f"6. direct: HTTP {status}: {bytes(body[:300])!r}")
            _, got = parse_infer_response(body, int(headers[HL.lower()]))
            if compare({"y": x}, got, 1e-5, 1e-8):
                raise SystemExit("6. direct: the echo differs")
        return (time.perf_counter() - t) * 1e3
    finally:
        await conn.close()


def run(sock: Path, work: Path, repeats: int, load, runner_of, verdict) -> None:
    source, tensors = carton(work / "selftest-carton")
    t = time.perf_counter()
    load(sock, "st", source)
    load_ms = (time.perf_counter() - t) * 1e3
    rsock, _ = runner_of(work / "root", "st")
    daemon = [asyncio.run(_daemon_run(Address(unix=str(sock)), "st")) for _ in range(repeats)]
    direct = [asyncio.run(_direct_run(Address(unix=str(rsock)), "st", tensors)) for _ in range(repeats)]
    d, r = statistics.median(daemon), statistics.median(direct)
    print(f"6. self-test, {TESTS} tests of 1 MiB FP32 (echo), median of {repeats}:")
    print(f"  load with selftest_on_load (fetch, runner start, the tests) {load_ms:8.1f} ms")
    print(f"  daemon POST .../selftest                                    {d:8.1f} ms")
    print(f"  the same ten requests straight to the runner, compared here {r:8.1f} ms  (ratio {d / r:.2f})\n")
    verdict("6. self-test, 10 x 1 MiB: daemon / direct runner calls", None, f"{d / r:.2f} ({d:.1f} vs {r:.1f} ms)")
