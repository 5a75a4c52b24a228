#!/usr/bin/env python3
"""Benchmark: what a runner's restart under load costs the requests that
wait for it, against the runner's own start time, in the same run.

    python tests/bench/bench_restart.py [--clients 8] [--rounds 3]

One daemon (runners.restart_backoff = 0, restart_wait 30 s, no sandbox),
the onnxruntime model of the tests (y = 2x + 1, float32 [n, 4]), one
runner instance. --clients threads send infers (tritonclient.http) in a
loop; the runner is SIGKILLed; the loop goes on until the restarted runner
has answered for a second.

- Baseline: the runner's start time, spawn to ready, as the daemon logs it
  for that very restart ("[m#0] ready (pid N) after S s").
- Ours: the requests that waited (sent after the kill and answered by the
  new runner: those sent within the kill and the new runner's first answer),
  their p99 latency, against start time + 50 ms.
- Also: the requests the runner had received when killed (failed, naming
  its death) and any other failure (0 expected).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]

import tritonclient.http as th
from kit.daemonkit import DaemonProcess, call
from kit.inferkit import onnx_carton
from tritonclient.utils import InferenceServerException

CONFIG = '[runners]\nrestart_backoff = "0s"\nrestart_wait = "30s"\nsandbox = "none"\n'
DIED_WITH_IT = "died with the request in it"
READY_AFTER = re.compile(r"\[m#0\] ready \(pid (\d+)\) after ([0-9.]+)s")


def pids(d: DaemonProcess) -> list[int | None]:
    rows = call(d, "POST", "/v2/repository/index", json={})[1]
    return next(r["pids"] for r in rows if r["name"] == "m")  # type: ignore[union-attr, index]  # rows


def client_loop(d: DaemonProcess, stop: threading.Event, out: list[tuple[float, float, str]]) -> None:
    client = th.InferenceServerClient(d.host_port, network_timeout=60.0, connection_timeout=60.0)
    x = np.ones((1, 4), dtype=np.float32)
    while not stop.is_set():
        inp = th.InferInput("x", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        started = time.perf_counter()
        try:
            client.infer("m", [inp])
            outcome = "OK"
        except InferenceServerException as e:
            outcome = str(e.message())
        out.append((started, time.perf_counter(), outcome))
    client.close()


def one_round(d: DaemonProcess, log: Path, clients: int) -> tuple[float, list[float], int, list[str]]:
    """(the restart's start time, latencies of requests that waited, requests that died with the runner, others failed)."""
    victim = pids(d)[0]
    assert victim is not None
    answers: list[tuple[float, float, str]] = []
    stop = threading.Event()
    threads = [threading.Thread(target=client_loop, args=(d, stop, answers)) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    killed = time.perf_counter()
    os.kill(victim, signal.SIGKILL)
    while pids(d)[0] in (victim, None):
        time.sleep(0.01)
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join()
    new = pids(d)[0]
    start_time = next(float(m[2]) for m in READY_AFTER.finditer(log.read_text()) if int(m[1]) == new)
    after = sorted((a for a in answers if a[0] >= killed), key=lambda a: a[1])
    first_ok = next(a[1] for a in after if a[2] == "OK")   # the new runner's first answer
    waited = sorted(end - start for start, end, outcome in after if outcome == "OK" and start <= first_ok)
    died = sum(1 for a in answers if DIED_WITH_IT in a[2])
    others = [a[2] for a in answers if a[2] != "OK" and DIED_WITH_IT not in a[2]]
    return start_time, waited, died, others


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="cs-bench-") as tmp:
        base = Path(tmp)
        (base / "cartonstore.toml").write_text(CONFIG)
        log = base / "daemon.log"
        d = DaemonProcess(base / "root", extra_args=["--config", str(base / "cartonstore.toml")], log_file=log).start()
        try:
            status, body = call(d, "POST", "/v2/repository/models/m/load",
                                json={"parameters": {"source": str(onnx_carton(base / "m"))}})
            assert status == 200, body
            for r in range(args.rounds):
                start_time, waited, died, others = one_round(d, log, args.clients)
                p99 = waited[min(len(waited) - 1, int(len(waited) * 0.99))]
                print(f"round {r + 1}, {args.clients} clients: runner start time {start_time * 1e3:.0f} ms; "
                      f"{len(waited)} requests waited, p50 {waited[len(waited) // 2] * 1e3:.0f} ms "
                      f"p99 {p99 * 1e3:.0f} ms (p99 - start time {(p99 - start_time) * 1e3:+.0f} ms, "
                      f"target <= +50 ms); {died} died with the runner; other failures {len(others)}"
                      + (f": {others[:2]}" if others else ""))
        finally:
            d.stop()


if __name__ == "__main__":
    main()
