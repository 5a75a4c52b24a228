#!/usr/bin/env python3
"""Benchmark: what models that come and go cost, against the same model
kept loaded, in the same run.

    python tests/bench/bench_lifecycle.py [--rounds 5] [--requests 2000]

One daemon (runners.load_on_demand = true), the python echo model of the
tests (tests/kit/inferkit.py, float32 only) in the store.

- First answer. Baseline: an explicit load (POST .../load by name) then the
  first infer, as a client does without load_on_demand. Ours: the infer
  alone to the model unloaded, which loads it on demand. Median of --rounds.
- Steady state. Baseline: --requests sequential infers (tritonclient.http,
  one connection) to the model loaded with no keep_alive. Ours: the same
  model loaded with keep_alive "1h", every request counted in flight and
  its unload time put off. p50 and p99 of each, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]

import tritonclient.http as th
from kit.daemonkit import DaemonProcess, call
from kit.inferkit import echo_carton

CONFIG = '[runners]\nload_on_demand = true\nsandbox = "none"\n'


def one_infer(client: th.InferenceServerClient) -> float:
    x = th.InferInput("x_float32", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    started = time.perf_counter()
    client.infer("echo", [x])
    return time.perf_counter() - started


def load(d: DaemonProcess, **params: object) -> None:
    status, body = call(d, "POST", "/v2/repository/models/echo/load", json={"parameters": params})
    assert status == 200, body


def unload(d: DaemonProcess) -> None:
    assert call(d, "POST", "/v2/repository/models/echo/unload", json={})[0] == 200


def first_answers(d: DaemonProcess, rounds: int) -> tuple[float, float]:
    explicit, on_demand = [], []
    for _ in range(rounds):
        client = th.InferenceServerClient(d.host_port, network_timeout=120.0)
        started = time.perf_counter()
        load(d)
        one_infer(client)
        explicit.append(time.perf_counter() - started)
        unload(d)
        on_demand.append(one_infer(client))
        unload(d)
        client.close()
    return statistics.median(explicit), statistics.median(on_demand)


def steady(d: DaemonProcess, requests: int, **params: object) -> tuple[float, float]:
    load(d, **params)
    client = th.InferenceServerClient(d.host_port)
    for _ in range(50):
        one_infer(client)
    times = sorted(one_infer(client) for _ in range(requests))
    client.close()
    unload(d)
    return times[len(times) // 2], times[int(len(times) * 0.99)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="cs-bench-") as tmp:
        base = Path(tmp)
        (base / "cartonstore.toml").write_text(CONFIG)
        d = DaemonProcess(base / "root", extra_args=["--config", str(base / "cartonstore.toml")]).start()
        try:
            load(d, source=str(echo_carton(base / "echo", dtypes=["float32"])))
            unload(d)
            explicit, on_demand = first_answers(d, args.rounds)
            print(f"first answer, median of {args.rounds}: load then infer {explicit * 1e3:.1f} ms, "
                  f"infer loading on demand {on_demand * 1e3:.1f} ms (ratio {on_demand / explicit:.2f})")
            plain = steady(d, args.requests)
            kept = steady(d, args.requests, keep_alive="1h")
            print(f"steady state, {args.requests} sequential infers: no keep_alive p50 {plain[0] * 1e3:.3f} ms "
                  f"p99 {plain[1] * 1e3:.3f} ms; keep_alive 1h p50 {kept[0] * 1e3:.3f} ms p99 {kept[1] * 1e3:.3f} ms "
                  f"(p50 ratio {kept[0] / plain[0]:.2f})")
        finally:
            d.stop()


if __name__ == "__main__":
    main()
