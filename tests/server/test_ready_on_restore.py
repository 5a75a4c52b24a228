"""Ready means ready: a daemon that has models to restore never answers
/v2/health/ready with 200 before every one of them was tried. A probe
polls the socket every 2 ms from before each start (a probe that connects
while the socket is only bound waits in its backlog, as a kubelet's
would) across 10 restarts; at its first 200 every model is already READY."""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path

import pytest
from kit.daemonkit import DaemonProcess, call, wait_for
from kit.inferkit import echo_carton, runner_pids

from cartonstore.cli.commands import main

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("restore")]

# A daemon that takes probes before it marks itself not ready answers one
# of them 200 in some restarts, not all: in 5 of 15 on a 2-core machine, so
# 10 restarts miss it with a chance of (2/3)**10, under 2 %.
RESTARTS = 10
PROBE_EVERY = 0.002
MODELS = ["echo", "f1", "f2", "f3", "f4"]   # one with a runner, four files only: restarts stay short


async def probe_ready(socket_path: Path) -> int:
    """One probe on a new connection, as orchestrators send them: its
    status, or 0 when nothing listens there yet."""
    try:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
    except OSError:
        return 0
    try:
        writer.write(b"GET /v2/health/ready HTTP/1.1\r\nHost: cartonstore\r\nConnection: close\r\n\r\n")
        await writer.drain()
        line = await reader.readline()
        return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else 0
    except OSError:
        return 0
    finally:
        writer.close()


def states(d: DaemonProcess) -> dict[str, str]:
    status, rows = call(d, "POST", "/v2/repository/index", json={})
    assert status == 200
    return {row["name"]: row["state"] for row in rows}


def test_ready_is_never_200_before_every_model_to_restore_was_tried(
        short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = short_tmp / "root"
    for name in MODELS:
        runner = "python" if name == "echo" else "tensorflow"   # tensorflow: no runner configured, files only
        source = echo_carton(short_tmp / "src" / name, label=name, runner=runner, dtypes=["float32"])
        assert main(["add", str(source), "--name", name, "--root", str(root), "--progress", "none"]) == 0
    capsys.readouterr()
    d = DaemonProcess(root, listen=None).start()
    for name in MODELS:
        assert call(d, "POST", f"/v2/repository/models/{name}/load", json={})[0] == 200
    d.stop(signal.SIGTERM)

    async def restart() -> dict[str, str]:
        """Start the daemon while probing it; the models' states at the first 200."""
        started = threading.Event()
        daemon = DaemonProcess(root, listen=None)
        thread = threading.Thread(target=lambda: (daemon.start(), started.set()))
        thread.start()
        try:
            while await probe_ready(daemon.socket_path) != 200:
                assert thread.is_alive() or started.is_set(), "the daemon did not start"
                await asyncio.sleep(PROBE_EVERY)
            return await asyncio.to_thread(states, daemon)
        finally:
            await asyncio.to_thread(thread.join)
            daemon.stop(signal.SIGTERM)

    for attempt in range(RESTARTS):
        at_first_200 = asyncio.run(restart())
        assert at_first_200 == dict.fromkeys(MODELS, "READY"), (attempt, at_first_200)
    assert wait_for(lambda: not runner_pids(root), 10), runner_pids(root)
