"""A runner decides nothing of what the daemon allocates: a hostile python
carton, loaded by a real root daemon under each sandbox mode, takes over
its runner's connection and answers the daemon as an attacker would
(kit/hostile_answers.py). The daemon runs in a memory cgroup of 1 GiB
(runners included, as they are its children there). Every such answer is
a 5xx naming what was wrong; a well-behaved model beside it answers every
request throughout, never held up for long; the daemon lives, and its
resident memory never passes 300 MiB. A carton whose runner answers its
readiness probe with 512 MiB or 4 GiB fails its load, naming why.

The p99 of the neighbour under these attacks against the same neighbour
alone is measured by tests/bench/bench_hostile.py, not asserted here.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from kit.daemonkit import DaemonProcess, call
from kit.hostile_answers import hostile_answers_carton
from kit.inferkit import echo_carton
from kit.sandboxkit import runner_user, why_not

from cartonstore.system.cgroups import create as create_cgroup

MAX_RSS = 300 << 20
ANSWER_LIMIT = "16M"   # server.max_request_size: the answer limit of a model whose outputs have no fixed size


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=30)
        self.path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(self.path)


class Neighbour:
    """Infers on the well-behaved model on one keep-alive connection while
    entered; every status and latency, on leaving."""

    BODY = json.dumps({"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]})

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.results: list[tuple[int, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        conn = UnixHTTPConnection(self.socket_path)
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                conn.request("POST", "/v2/models/echo/infer", self.BODY, {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                status = response.status
            except OSError:
                status = 0
                conn.close()
                conn = UnixHTTPConnection(self.socket_path)
            self.results.append((status, time.perf_counter() - started))
            time.sleep(0.005)
        conn.close()

    def __enter__(self) -> Neighbour:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def resident(pid: int, field: str = "VmHWM") -> int:
    """VmHWM: the most resident memory the process has had."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(f"{field}:"))


def order(d: DaemonProcess, what: str) -> tuple[int, str]:
    status, body = call(d, "POST", "/v2/models/hostile/infer",
                        json={"inputs": [{"name": "x_string", "datatype": "BYTES", "shape": [1, 1], "data": [what]}]})
    return status, body.get("error", "") if isinstance(body, dict) else str(body)


ATTACKS = [
    # (order, status, what the error must say)
    ("length:4294967296", 502, "answered with Content-Length 4294967296, over its limit of 16.0 MiB"),
    ("length:536870912", 502, "over its limit of 16.0 MiB"),
    ("chunks:", 502, "answered chunks of more than 16.0 MiB in all"),
    ("eof:", 502, "answered more than 16.0 MiB"),
    ("tiny:", 502, "answered in more than 16384 chunks"),
    ("headers:40000", 502, "response head longer than 65536 bytes"),
    ("undeclared:", 502, "output 'not_declared': is not an output of this model (outputs: 'y_string')"),
    ("gzip:256", 502, "answered with Content-Encoding 'gzip': runners must not compress"),
]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bwrap", "landlock"])
def test_hostile_answers_are_named_5xx_and_cost_the_daemon_nothing(mode: str) -> None:
    from conftest import short_dir

    if (why := why_not(mode)) is not None:
        pytest.skip(why)
    cgroup = create_cgroup(f"cs-test-hostile-{os.getpid()}-{mode}", max_processes=None, memory_limit=1 << 30)
    if cgroup is None or "cgroup:memory" not in cgroup.layers:
        pytest.skip("no memory cgroup can be made here to hold the daemon (cgroup v1 memory or v2 with memory "
                    "delegated)")
    try:
        with short_dir() as base:
            base.chmod(0o711)
            config = base / "cartonstore.toml"
            config.write_text(f'[server]\nmax_request_size = "{ANSWER_LIMIT}"\n[runners]\nsandbox = "{mode}"\n'
                              f'user = "{runner_user().pw_name}"\n')
            d = DaemonProcess(base / "root", extra_args=["--config", str(config)], env={"CARTONSTORE_SANDBOX": mode},
                              log_file=base / "daemon.log")
            with d:
                pid = d.proc.pid
                for directory in cgroup.dirs:
                    (directory / "cgroup.procs").write_text(str(pid))
                for name, source in (("echo", echo_carton(base / "echo", dtypes=["float32"])),
                                     ("hostile", hostile_answers_carton(base / "hostile"))):
                    status, body = call(d, "POST", f"/v2/repository/models/{name}/load",
                                        json={"parameters": {"source": str(source)}})
                    assert status == 200, body
                with Neighbour(d.socket_path) as neighbour:
                    for attack, want_status, want in ATTACKS:
                        status, error = order(d, attack)
                        assert (status, want in error) == (want_status, True), (attack, status, error)
                        assert "runner for hostile" in error, error
                        assert d.proc.poll() is None, f"the daemon died after {attack}"
                    for size in (512 << 20, 4 << 30):
                        source = hostile_answers_carton(base / f"health-{size}", health_attack=f"length:{size}")
                        status, body = call(d, "POST", f"/v2/repository/models/health{size}/load",
                                            json={"parameters": {"source": str(source)}})
                        assert status == 400, body
                        assert f"answering its readiness probe (/v2/health/ready) wrongly: answered with " \
                               f"Content-Length {size}, over its limit of 64.0 KiB" in body["error"], body
                    status, body = call(d, "POST", "/v2/models/hostile/infer", json={"inputs": [
                        {"name": "x_string", "datatype": "BYTES", "shape": [1, 1], "data": ["escaped:4"]}]})
                    # a valid answer, walked off the event loop whatever the spelling of its datatype
                    assert status == 200 and '"shape": [4000000, 1]' in str(body)[:300], (status, str(body)[:300])
                    logged_before = _runner_lines(base / "daemon.log")
                    flood_started = time.monotonic()
                    assert order(d, "stderr:20") == (200, ""), "the model's answer after its stderr flood"
                    flood_took = time.monotonic() - flood_started
                    status, error = order(d, "undeclared:")   # it still runs, and is still held to its outputs
                    assert status == 502, error
                assert d.proc.poll() is None
                assert resident(pid) < MAX_RSS, f"the daemon's resident memory peaked at {resident(pid) >> 20} MiB"
                statuses = {status for status, _ in neighbour.results}
                assert neighbour.results and statuses == {200}, statuses
                slowest = max(took for _, took in neighbour.results)
                assert slowest < 1.0, f"a neighbour's infer took {slowest:.2f}s: the daemon's event loop was held"
                logged = _runner_lines(base / "daemon.log") - logged_before
                # 200 at once and 20 a second, of the 10,485,760 lines it wrote (and a line saying so)
                assert logged <= 200 + 20 * (flood_took + 2) + 5, logged
                assert "output lines not logged" in (base / "daemon.log").read_text()
    finally:
        cgroup.remove()


def _runner_lines(log: Path) -> int:
    with open(log, errors="replace") as f:
        return sum(1 for line in f if line.rstrip().endswith("[hostile#0] x"))
