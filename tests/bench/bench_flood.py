#!/usr/bin/env python3
"""Benchmark: the daemon's HTTP Unix socket while clients with no credential
flood its other listeners (issue 37: "the Unix-socket API keeps answering,
p99 under 100 ms").

One daemon (head_timeout and idle_timeout 2 s, max_connections 1000 per
listener, gRPC on loopback TCP too) is probed from another process over
its HTTP Unix socket, a fresh connection per request (POST
/v2/repository/index), for --seconds with nothing else going on (the
baseline, same daemon, same run), then for --seconds while
tests/kit/floodkit.issue_flood holds it: 20,000 TCP connections (HTTP
stalled or dripping a header line every 0.5 s, gRPC sending its preface
alone) and 5,000 to the gRPC Unix socket, from 40 loopback addresses.
Printed: p50, p99 and max of each phase, their ratio, every status, and
how the flood's connections ended (closed in time or late).

    python tests/bench/bench_flood.py [--seconds 18]

Needs a hard RLIMIT_NOFILE of at least 11,000 (each flooding process holds
up to 10,000 sockets).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))

from kit.daemonkit import DaemonProcess, call
from kit.floodkit import DAEMON_CONFIG, PER_CHILD, Probe, issue_flood
from kit.inferkit import echo_carton


def figures(latencies: list[float]) -> tuple[float, float, float]:
    ordered = sorted(latencies)
    return (ordered[len(ordered) // 2] * 1000, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
            ordered[-1] * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=18.0)
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < PER_CHILD + 1000:
        sys.exit(f"the hard descriptor limit is {hard}; flooding needs {PER_CHILD + 1000}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="cs-bf-") as tmp:
        base = Path(tmp)
        base.chmod(0o711)   # the runner user passes through to the store
        config = base / "cartonstore.toml"
        config.write_text(DAEMON_CONFIG)
        with DaemonProcess(base / "root", extra_args=["--config", str(config), "--grpc-listen", "127.0.0.1:0"],
                           log_file=base / "daemon.log") as d:
            status, body = call(d, "POST", "/v2/repository/models/echo/load",
                                json={"parameters": {"source": str(echo_carton(base / "echo", dtypes=["float32"]))}})
            assert status == 200, body
            alone = Probe(d, args.seconds).results()
            floods = issue_flood(d, seconds=args.seconds + 8)
            flooded = Probe(d, args.seconds).results()
            outcome = floods.outcome()
        print(f"the HTTP Unix socket, a fresh connection per request, {args.seconds:g} s each:")
        rows = (("alone", alone), ("flooded", flooded))
        for label, results in rows:
            p50, p99, most = figures([seconds for _, seconds in results])
            statuses: dict[object, int] = {}
            for status, _ in results:
                statuses[status] = statuses.get(status, 0) + 1
            print(f"  {label:8} {len(results):5d} requests  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  max {most:7.2f} ms  "
                  f"statuses {statuses}")
        ratios = [b / a for a, b in zip(*(figures([s for _, s in r]) for _, r in rows), strict=True)]
        print(f"  [ratio] flooded/alone: p50 {ratios[0]:.2f}x  p99 {ratios[1]:.2f}x  max {ratios[2]:.2f}x")
        for name, got in outcome.items():
            print(f"  flood {name:10} ends {dict(got['ends'])}  late {got['late']}  still open {got['still_open']}")


if __name__ == "__main__":
    main()
