#!/usr/bin/env python3
"""Benchmark: Triton's response cache in the daemon, a cached answer
against the uncached one, in the same run.

    python tests/bench/bench_response_cache.py [--requests 1000] [--elements 64] [--sandbox auto]

A python-runner model whose execution is 1 ms (it sleeps 1 ms, then
answers y = 2x) is loaded twice into one daemon ([cache] size 64 MiB):
"cached" with response_cache {enable: true}, "plain" without. One client
sends the same binary v2 request (x: --elements float32) --requests times
back to back to each over one kept-alive HTTP connection, then over gRPC
(stock tritonclient); the first request of each warms.

Printed: p50 and p99 of each, the ratio cached / plain of the p50s
(target <= 0.5), the daemon's own figures (statistics' cache_hit and
cache_miss), and what hashing a request's tensors takes on the event loop
and through a thread, by size (what HASH_IN_THREAD_FROM rests on).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE.parent))

from kit.daemonkit import DaemonProcess, call
from kit.runnerkit import carton_toml

from cartonstore.server.models.response_cache import HASH_IN_THREAD_FROM
from cartonstore.v2.encode import encode_infer_request

SLEEPER = '''
import time

class Sleeper:
    def infer_with_tensors(self, tensors):
        time.sleep(0.001)   # the model's execution: 1 ms
        return {"y": tensors["x"] * 2}

def get_model():
    return Sleeper()
'''


def sleeper_carton(dest: Path) -> Path:
    (dest / "model").mkdir(parents=True)
    (dest / "model" / "main.py").write_text(SLEEPER)
    (dest / "carton.toml").write_text(carton_toml(
        "python", ">=3.8", {"entrypoint_package": "main", "entrypoint_fn": "get_model"}, model_name="sleeper",
        inputs=[("x", "float32", ["n"])], outputs=[("y", "float32", ["n"])]))
    return dest


def http_latencies(host_port: str, name: str, body: bytes, header_length: int, count: int) -> list[float]:
    host, port = host_port.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port))
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_length)}
    out = []
    try:
        for _ in range(count + 1):
            started = time.perf_counter()
            conn.request("POST", f"/v2/models/{name}/infer", body=body, headers=headers)
            answer = conn.getresponse()
            answer.read()
            out.append(time.perf_counter() - started)
            assert answer.status == 200, answer.status
    finally:
        conn.close()
    return out[1:]   # the first warms


def grpc_latencies(target: str, name: str, x: np.ndarray, count: int) -> list[float]:
    import tritonclient.grpc as tg

    c = tg.InferenceServerClient(target)
    tensor = tg.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    out = []
    try:
        for _ in range(count + 1):
            started = time.perf_counter()
            c.infer(name, [tensor])
            out.append(time.perf_counter() - started)
    finally:
        c.close()
    return out[1:]


def figures(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return statistics.median(ordered) * 1e3, ordered[int(len(ordered) * 0.99) - 1] * 1e3


def hashing_figures() -> None:
    """sha256 of a request's bytes inline vs through asyncio.to_thread, by size."""
    async def through_thread(data: bytes) -> float:
        started = time.perf_counter()
        for _ in range(200):
            await asyncio.to_thread(lambda: hashlib.sha256(data).digest())
        return (time.perf_counter() - started) / 200

    print(f"hashing (HASH_IN_THREAD_FROM = {HASH_IN_THREAD_FROM // 1024} KiB): size, inline us, through a thread us")
    for size in (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20):
        data = bytes(size)
        started = time.perf_counter()
        for _ in range(200):
            hashlib.sha256(data).digest()
        inline = (time.perf_counter() - started) / 200
        threaded = asyncio.run(through_thread(data))
        print(f"  {size // 1024:5d} KiB  {inline * 1e6:9.1f}  {threaded * 1e6:9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--elements", type=int, default=64)
    parser.add_argument("--sandbox", default="auto")
    args = parser.parse_args()
    x = np.arange(args.elements, dtype=np.float32)
    parts, header_length = encode_infer_request({"x": x}, binary=True, binary_outputs=True)
    body = b"".join(bytes(p) for p in parts)
    with tempfile.TemporaryDirectory(prefix="cs-bench-cache-", dir="/tmp") as tmp:
        base = Path(tmp)
        config = base / "cartonstore.toml"
        config.write_text(f'[cache]\nsize = "64MiB"\n[runners]\nsandbox = "{args.sandbox}"\n')
        src = sleeper_carton(base / "sleeper")
        with DaemonProcess(base / "root", extra_args=["--config", str(config), "--grpc-listen", "127.0.0.1:0"]) as d:
            for name, cfg in (("cached", {"response_cache": {"enable": True}}), ("plain", {})):
                status, answer = call(d, "POST", f"/v2/repository/models/{name}/load",
                                      json={"parameters": {"source": str(src), "config": json.dumps(cfg)}})
                assert status == 200, answer
            results = {}
            for door in ("http", "grpc"):
                for name in ("plain", "cached"):
                    if door == "http":
                        lat = http_latencies(d.host_port, name, body, header_length or 0, args.requests)
                    else:
                        lat = grpc_latencies(d.grpc_host_port, name, x, args.requests)
                    results[door, name] = figures(lat)
            stats = call(d, "GET", "/v2/models/cached/stats")[1]["model_stats"][0]["inference_stats"]
    print(f"model execution 1 ms; {args.requests} requests of {args.elements} float32 each, back to back")
    for door in ("http", "grpc"):
        (p50, p99), (c50, c99) = results[door, "plain"], results[door, "cached"]
        print(f"{door:5s} uncached p50 {p50:.3f} ms p99 {p99:.3f} ms | cached p50 {c50:.3f} ms p99 {c99:.3f} ms | "
              f"cached/uncached p50 {c50 / p50:.2f} (target <= 0.5)")
    hits, misses = stats["cache_hit"], stats["cache_miss"]
    print(f"daemon: cache_hit {hits['count']} ({hits['ns'] / max(hits['count'], 1) / 1e3:.1f} us each), "
          f"cache_miss {misses['count']} ({misses['ns'] / max(misses['count'], 1) / 1e3:.1f} us each)")
    hashing_figures()


if __name__ == "__main__":
    main()
