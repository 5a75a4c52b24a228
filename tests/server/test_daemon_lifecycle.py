"""Starting and stopping the daemon as systemd does: notify, socket
activation, SIGTERM, stale and live sockets."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, work_in_tmp
from kit.daemonkit import DaemonProcess, unix_session, wait_for, wait_for_async

from cartonstore.cli.commands import main


def test_notify_ready_then_sigterm_stops_cleanly(short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "root").start()
    assert "READY=1" in d.status and f"unix:{d.socket_path}" in d.status
    assert d.socket_path.exists()
    assert stat.S_IMODE(os.stat(d.socket_path).st_mode) == 0o660, "socket_mode's default"
    assert d.stop(signal.SIGTERM) == 0
    assert not d.socket_path.exists()
    err = d.proc.stderr.read()
    assert "shutting down" in err and "stopped" in err


@pytest.mark.slow
def test_sigterm_waits_for_an_in_flight_request(short_tmp: Path, origin) -> None:
    from kit.origin import Fault

    origin.put("/slow.carton", FIXTURE_CARTON.read_bytes(), fault=Fault(delay=1.0, times=2))
    d = DaemonProcess(short_tmp / "root").start()

    async def load() -> int:
        async with unix_session(d.socket_path) as s, s.post("/v2/repository/models/slow/load",
                                                             json={"parameters": {"source": origin.url("/slow.carton")}}) as r:
            return r.status

    async def scenario() -> int:
        task = asyncio.ensure_future(load())
        assert await wait_for_async(lambda: any(r.path == "/slow.carton" for r in origin.requests))   # under way
        d.proc.send_signal(signal.SIGTERM)
        return await task

    assert asyncio.run(scenario()) == 200
    assert d.proc.wait(30) == 0
    from cartonstore.store import Store

    with Store(d.root) as s:
        assert s.verify().ok and s.resolve("slow") == FIXTURE_DIGEST
        assert s.index.count_live_leases() == 0  # the pin of the loaded model went with the daemon


@pytest.mark.slow
def test_a_client_that_disconnects_mid_load_leaves_nothing_half_done(short_tmp: Path, origin) -> None:
    from kit.origin import Fault

    origin.put("/slow.carton", FIXTURE_CARTON.read_bytes(), fault=Fault(delay=0.5, times=3))
    with DaemonProcess(short_tmp / "root") as d:
        async def give_up() -> None:
            async with unix_session(d.socket_path) as s:
                with pytest.raises(asyncio.TimeoutError):
                    async with asyncio.timeout(0.3):
                        await s.post("/v2/repository/models/m/load",
                                     json={"parameters": {"source": origin.url("/slow.carton")}})

        asyncio.run(give_up())
        # The fetch goes on for whoever asks next; the store ends up whole.
        assert wait_for(lambda: (d.root / "models" / FIXTURE_DIGEST).is_dir(), timeout=20)
        assert work_in_tmp(d.root) == []
    from cartonstore.store import Store

    with Store(d.root) as s:
        assert s.verify().ok


@pytest.mark.slow
def test_stale_socket_from_a_crash_is_replaced(short_tmp: Path) -> None:
    root = short_tmp / "root"
    first = DaemonProcess(root).start()
    first.stop(signal.SIGKILL)
    assert first.socket_path.exists(), "a killed daemon leaves its socket file"
    with DaemonProcess(root) as second:
        assert "READY=1" in second.status


@pytest.mark.slow
def test_a_live_socket_is_never_hijacked(short_tmp: Path) -> None:
    root = short_tmp / "root"
    with DaemonProcess(root, listen=None) as first:
        p = subprocess.run([sys.executable, "-m", "cartonstore.cli", "serve", "--root", str(root),
                            "--socket", str(first.socket_path)], capture_output=True, text=True, timeout=30)
        assert p.returncode == 7
        assert "another daemon is already serving" in p.stderr
        assert first.proc.poll() is None
        asyncio.run(_health(first.socket_path))


async def _health(sock: Path) -> None:
    async with unix_session(sock) as s, s.get("/v2/health/live") as r:
        assert r.status == 200


@pytest.mark.parametrize("make,code,pattern", [
    (lambda t: t / "missing-dir" / "s.sock", 4, "does not exist"),
    (lambda t: (t / "file.txt", (t / "file.txt").write_text("x"))[0], 4, "not a socket"),
    (lambda t: t / ("x" * 120 + ".sock"), 4, "longer than"),
])
def test_bad_socket_paths(short_tmp: Path, make, code: int, pattern: str) -> None:
    path = make(short_tmp)
    p = subprocess.run([sys.executable, "-m", "cartonstore.cli", "serve", "--root", str(short_tmp / "root"),
                        "--socket", str(path)], capture_output=True, text=True, timeout=30)
    assert p.returncode == code and pattern in p.stderr, p.stderr


def test_socket_activation(short_tmp: Path) -> None:
    """systemd passes the listening socket as fd 3 with LISTEN_FDS/LISTEN_PID."""
    sock_path = short_tmp / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen(16)
    fd = listener.fileno()
    root = short_tmp / "root"
    notify_path = short_tmp / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(30)
    # What systemd does between fork and exec: the socket becomes fd 3 and
    # LISTEN_PID names the process that will exec the daemon.
    launcher = ("import os, sys\n"
                "fd = int(sys.argv[1])\n"
                "if fd != 3:\n    os.dup2(fd, 3)\n    os.close(fd)\n"
                "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1')\n"
                "os.execv(sys.executable, [sys.executable, '-m', 'cartonstore.cli', 'serve', '--root', sys.argv[2]])\n")
    proc = subprocess.Popen([sys.executable, "-c", launcher, str(fd), str(root)], pass_fds=(fd,),
                            env={**os.environ, "NOTIFY_SOCKET": str(notify_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        listener.close()  # the daemon holds its own copy now
        assert "READY=1" in notify.recv(4096).decode()
        asyncio.run(_health(sock_path))
        assert not (root / "cartonstore.sock").exists(), "an activated daemon binds nothing itself"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        notify.close()


def test_listen_port_zero_is_logged_and_served(short_tmp: Path) -> None:
    with DaemonProcess(short_tmp / "root", listen="127.0.0.1:0") as d:
        import urllib.request

        with urllib.request.urlopen(d.http_url + "/v2") as r:
            assert json.loads(r.read())["name"] == "cartonstore"
    assert d.http_url in d.proc.stderr.read()


@pytest.mark.slow
def test_leases_are_visible_to_every_process(short_tmp: Path, capsys) -> None:
    root = short_tmp / "root"
    main(["add", str(FIXTURE_CARTON), "--name", "fx", "--root", str(root), "--progress", "none"])
    capsys.readouterr()
    with DaemonProcess(root, listen=None, socket_path=short_tmp / "a.sock") as a, \
            DaemonProcess(root, listen=None, socket_path=short_tmp / "b.sock") as b:
        async def lease_on_a_release_on_b() -> tuple[int, int]:
            async with unix_session(a.socket_path) as s, s.post("/v1/leases", json={"model": "fx", "ttl": 30}) as r:
                lease = (await r.json())["lease"]
            async with (unix_session(b.socket_path) as s, s.post(f"/v1/leases/{lease}/renew", json={"ttl": 30}) as r1,
                        s.delete(f"/v1/leases/{lease}") as r2):
                return r1.status, r2.status

        assert asyncio.run(lease_on_a_release_on_b()) == (200, 200)
    assert main(["rm", "fx", "--root", str(root)]) == 0
