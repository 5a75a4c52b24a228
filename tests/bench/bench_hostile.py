#!/usr/bin/env python3
"""Benchmark: a neighbour's latency while a hostile model attacks the daemon
through its own answers (issue 37: "a neighbour model's p99 stays under 50
ms throughout").

One daemon serves two python cartons: "echo", the neighbour, and "hostile"
(tests/kit/hostile_answers.py), whose model code takes over its runner's
connection. One client infers on echo in a closed loop over the Unix
socket (keep-alive, 1x1 FP32 as JSON, as a loader would); its p50, p99 and
max are measured for --seconds alone (the baseline, in the same run and
daemon), then for --seconds while a second client sends the hostile model
one attack after another, back to back: a 4 GiB Content-Length, endless
chunks, endless one-byte chunks, no length, 40,000 headers, an undeclared
output, a gzip bomb, 4 million BYTES elements under an escaped datatype,
and 100 MiB of two-byte stderr lines. Printed: each phase's figures, the ratio of
attacked to alone, the daemon's peak resident memory (VmHWM), and the
daemon's log lines from the runner.

    python tests/bench/bench_hostile.py [--seconds 20] [--sandbox none|auto|bwrap|landlock]
    python tests/bench/bench_hostile.py --check-cost

--check-cost times, in this process, what checking an honest answer
against the model's declared outputs costs the daemon per answer
(server/runner_processes/answer_check.py), against what checking the request of
the same shape costs (parse and validate_request), in the same run.

A sandbox other than none needs root and a Python the runner user may
execute (as the test suite's sandbox tests).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))

from kit.daemonkit import DaemonProcess, call
from kit.hostile_answers import hostile_answers_carton
from kit.inferkit import echo_carton

ATTACKS = ["length:4294967296", "chunks:", "tiny:", "eof:", "headers:40000", "undeclared:", "gzip:256", "escaped:4",
           "stderr:100"]
ECHO = json.dumps({"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]})


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=120)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def post(conn: UnixHTTPConnection, path: str, body: str) -> int:
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    return response.status


def neighbour(socket_path: str, seconds: float) -> tuple[list[float], dict[int, int]]:
    conn = UnixHTTPConnection(socket_path)
    took, statuses = [], {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        status = post(conn, "/v2/models/echo/infer", ECHO)
        took.append(time.perf_counter() - started)
        statuses[status] = statuses.get(status, 0) + 1
    conn.close()
    return took, statuses


def attacker(socket_path: str, stop: threading.Event, outcomes: dict[str, list[int]]) -> None:
    while not stop.is_set():
        for attack in ATTACKS:
            if stop.is_set():
                return
            conn = UnixHTTPConnection(socket_path)
            body = json.dumps({"inputs": [{"name": "x_string", "datatype": "BYTES", "shape": [1, 1],
                                           "data": [attack]}]})
            outcomes.setdefault(attack, []).append(post(conn, "/v2/models/hostile/infer", body))
            conn.close()


def figures(took: list[float]) -> tuple[float, float, float]:
    ordered = sorted(took)
    return (ordered[len(ordered) // 2] * 1000, ordered[int(len(ordered) * 0.99)] * 1000, ordered[-1] * 1000)


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("VmHWM:"))


def check_cost() -> None:
    import timeit

    import numpy as np

    from cartonstore.format.carton_toml import TensorSpec
    from cartonstore.server.runner_processes.answer_check import checked_answer
    from cartonstore.server.runner_processes.settings import RunnerResponse
    from cartonstore.v2.framing import (
        HEADER_LENGTH,
        encode_infer_request,
        encode_infer_response,
        parse_infer_request,
    )
    from cartonstore.v2.validate import validate_request

    print("checking one honest answer against the declared outputs, against checking the request of that shape:")
    for label, shape, binary in (("1x4 FP32, JSON", (1, 4), False), ("1x4 FP32, binary", (1, 4), True),
                                 ("1024x1024 FP32 (4 MiB), binary", (1024, 1024), True),
                                 ("64x1024 FP32, JSON", (64, 1024), False)):
        array = np.ones(shape, np.float32)
        spec = [TensorSpec("y", "float32", ("n", shape[1]))]
        parts, length = encode_infer_response(model_name="m", model_version=None, request_id=None,
                                              outputs={"y": array}, binary=lambda _: binary)  # noqa: B023 - called here
        response = RunnerResponse(200, {HEADER_LENGTH: str(length)} if length else {},
                                  b"".join(bytes(p) for p in parts))
        request_parts, request_length = encode_infer_request({"y": array}, binary=binary)
        request = b"".join(bytes(p) for p in request_parts)
        rounds = 2000 if array.size < 10_000 else 20
        answer_us = min(timeit.repeat(lambda: checked_answer(response, spec, "runner for m"),  # noqa: B023 - timed here
                                      number=rounds,
                                      repeat=5)) / rounds * 1e6
        request_us = min(timeit.repeat(
            lambda: validate_request(parse_infer_request(request, request_length), spec, None),  # noqa: B023 - timed here
            number=rounds, repeat=5)) / rounds * 1e6
        print(f"  {label:32} answer {answer_us:9.1f} us  request {request_us:9.1f} us  "
              f"[ratio] {answer_us / request_us:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--sandbox", default="none", choices=["none", "auto", "bwrap", "landlock"])
    parser.add_argument("--check-cost", action="store_true")
    args = parser.parse_args()
    if args.check_cost:
        check_cost()
        return
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="cs-bh-") as tmp:
        base = Path(tmp)
        base.chmod(0o711)
        config = base / "cartonstore.toml"
        config.write_text(f'[server]\nmax_request_size = "16M"\n[runners]\nsandbox = "{args.sandbox}"\n')
        log = base / "daemon.log"
        with DaemonProcess(base / "root", listen=None, extra_args=["--config", str(config)], log_file=log) as d:
            for name, source in (("echo", echo_carton(base / "echo", dtypes=["float32"])),
                                 ("hostile", hostile_answers_carton(base / "hostile"))):
                status, body = call(d, "POST", f"/v2/repository/models/{name}/load",
                                    json={"parameters": {"source": str(source)}})
                assert status == 200, body
            neighbour(str(d.socket_path), 2.0)   # warm
            alone, alone_statuses = neighbour(str(d.socket_path), args.seconds)
            stop, outcomes = threading.Event(), {}
            attacks = threading.Thread(target=attacker, args=(str(d.socket_path), stop, outcomes))
            attacks.start()
            attacked, attacked_statuses = neighbour(str(d.socket_path), args.seconds)
            stop.set()
            attacks.join()
            pid = d.proc.pid
            print(f"sandbox {args.sandbox}, {args.seconds:g} s each, the neighbour's closed loop (1 client):")
            for label, took, statuses in (("alone", alone, alone_statuses), ("attacked", attacked, attacked_statuses)):
                p50, p99, most = figures(took)
                print(f"  {label:9} {len(took):6d} infers  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  max {most:7.2f} ms  "
                      f"statuses {statuses}")
            ratios = [b / a for a, b in zip(figures(alone), figures(attacked), strict=True)]
            print(f"  [ratio] attacked/alone: p50 {ratios[0]:.2f}x  p99 {ratios[1]:.2f}x  max {ratios[2]:.2f}x")
            print(f"  attacks answered: { {a: sorted(set(s)) for a, s in outcomes.items()} } "
                  f"({sum(len(s) for s in outcomes.values())} in all)")
            print(f"  daemon peak resident memory: {peak_rss(pid)} MiB; alive: {d.proc.poll() is None}")
        lines = sum(1 for line in log.read_text(errors="replace").splitlines() if "[hostile#0]" in line)
        print(f"  daemon log lines from the hostile runner: {lines}")


if __name__ == "__main__":
    main()
