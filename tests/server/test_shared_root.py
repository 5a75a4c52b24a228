"""Two daemons on one store root, each with the same model loaded: each
keeps its own runners (their sockets in a directory named by its owner
token) and its own pin, whatever happens to the other. One serves 8
clients while the other is stopped (SIGTERM or SIGKILL) and started again,
twice: no request fails, no runner socket is ever
served by the other daemon's runner, the survivor's pin stays, the other's
is dropped or swept and taken again, and gc keeps the survivor's model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from kit.daemonkit import DaemonProcess, call, unix_session, wait_for
from kit.inferkit import echo_carton, runner_pids

from cartonstore.cli.commands import main

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("shared_root")]

# The first restart meets the survivor's live runners and pin (and a gc
# between the two daemons); the second meets what the first one left behind
# too (the gone daemon's own runner directory and pin). What a restart could
# break, a runner socket unlinked or its runner stopped, a pin dropped,
# lasts: the traffic after it, until TAIL_SECONDS past the last restart,
# fails on it.
RESTARTS = 2
TAIL_SECONDS = 3.0
CLIENTS = 8
# Between a client's requests: a restart takes seconds, so each of its steps
# meets requests from every client all the same, without the clients taking
# every core from the daemons they watch (and from the rest of the suite).
PAUSE = 0.01
BODY = json.dumps({"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 1], "data": [5.0]}]}).encode()


def listening_paths(pid: int) -> set[str]:
    """The paths of the Unix sockets process ``pid`` listens on (from
    /proc/net/unix, where a socket keeps its path even once its file is
    replaced: two listeners with one path are two lines)."""
    listening: dict[str, str] = {}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[5] == "01" and int(fields[3], 16) & 0x10000:   # unconnected, __SO_ACCEPTCON
            listening[fields[6]] = fields[7]
    paths = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in listening:
            paths.add(listening[target[8:-1]])
    return paths


def runner_dir(d: DaemonProcess) -> Path:
    """The directory its model's runners listen in, checked to be one
    directory of its own, under the store's runner sockets."""
    status, rows = call(d, "POST", "/v2/repository/index", json={})
    assert status == 200
    (row,) = [r for r in rows if r["name"] == "m"]
    assert row["state"] == "READY", row
    paths = {Path(p) for pid in row["pids"] for p in listening_paths(pid)}
    assert paths and len({p.parent for p in paths}) == 1, paths
    where = next(iter(paths)).parent
    assert where.parent == d.root / "run" / "runners", where
    return where


def pins(root: Path) -> dict[str, str]:
    conn = sqlite3.connect(root / "index.db")
    try:
        return dict(conn.execute("SELECT id, carton FROM leases WHERE id LIKE 'pin:%' AND expires_at>?",
                                 (time.time(),)))
    finally:
        conn.close()


def ready(d: DaemonProcess) -> bool:
    return call(d, "GET", "/v2/health/ready")[0] == 200


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_daemon_serves_on_while_another_on_its_root_stops_and_starts(
        short_tmp: Path, sig: int, capsys: pytest.CaptureFixture[str]) -> None:
    root = short_tmp / "root"
    source = echo_carton(short_tmp / "src", dtypes=["float32"])
    assert main(["add", str(source), "--name", "m", "--root", str(root), "--progress", "none"]) == 0
    capsys.readouterr()
    a = DaemonProcess(root, socket_path=short_tmp / "a.sock", listen=None, log_file=short_tmp / "a.log").start()
    b = DaemonProcess(root, socket_path=short_tmp / "b.sock", listen=None, log_file=short_tmp / "b.log").start()
    try:
        for d in (a, b):
            status, body = call(d, "POST", "/v2/repository/models/m/load", json={})
            assert status == 200, body
        a_dir, b_dir = runner_dir(a), runner_dir(b)
        assert a_dir != b_dir
        a_pin, b_pin = f"pin:{a_dir.name}:m", f"pin:{b_dir.name}:m"
        assert set(pins(root)) == {a_pin, b_pin}
        digest = pins(root)[a_pin]
        restarts = 0

        def stop_and_start_b() -> None:
            nonlocal b, b_dir, b_pin, restarts
            b.stop(sig)
            assert wait_for(lambda: not [p for p in runner_pids(root) if b_dir.name in _cmdline(p)], 10)
            assert a_pin in pins(root)
            if restarts == 0:   # gc keeps what the live daemon pinned, whatever the gone one left
                assert main(["gc", "--local", "--max-size", "0", "--grace", "0s", "--root", str(root)]) == 0
                assert (root / "models" / digest).is_dir()
            b = DaemonProcess(root, socket_path=short_tmp / "b.sock", listen=None, log_file=short_tmp / "b.log").start()
            assert wait_for(lambda: ready(b), 30)   # it loaded m again (restore), with runners of its own
            old_pin, b_dir = b_pin, runner_dir(b)
            b_pin = f"pin:{b_dir.name}:m"
            assert old_pin != b_pin and set(pins(root)) == {a_pin, b_pin}   # the gone one's pin: dropped or swept
            assert runner_dir(a) == a_dir
            restarts += 1

        async def traffic() -> tuple[list[int], list[str]]:
            statuses: list[int] = []
            errors: list[str] = []
            done = asyncio.Event()

            async def client() -> None:
                async with unix_session(a.socket_path) as s:
                    while not done.is_set():
                        try:
                            async with s.post("/v2/models/m/infer", data=BODY) as r:
                                statuses.append(r.status)
                                if r.status != 200:
                                    errors.append(await r.text())
                        except Exception as e:  # noqa: BLE001 - counted as a failed request
                            errors.append(repr(e))
                        await asyncio.sleep(PAUSE)

            async def cycle_b() -> None:
                try:
                    while restarts < RESTARTS:
                        await asyncio.to_thread(stop_and_start_b)
                    await asyncio.sleep(TAIL_SECONDS)
                finally:
                    done.set()

            await asyncio.gather(cycle_b(), *(client() for _ in range(CLIENTS)))
            return statuses, errors

        statuses, errors = asyncio.run(traffic())
        capsys.readouterr()   # gc's report
        assert restarts == RESTARTS, restarts
        assert not errors, (len(errors), errors[:5])
        assert len(statuses) > CLIENTS * 10 and set(statuses) == {200}
        assert a_pin in pins(root) and runner_dir(a) == a_dir
        log = (short_tmp / "a.log").read_text() + (short_tmp / "b.log").read_text()
        assert "still served by a live process" not in log
    finally:
        for d in (a, b):
            if d.proc is not None and d.proc.poll() is None:
                d.stop()
    assert wait_for(lambda: not runner_pids(root), 10), runner_pids(root)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
