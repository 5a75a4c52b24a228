"""A daemon's identity (server.id, CARTONSTORE_ID): what it loaded is kept
under it, not under its socket's path, so a daemon started again in
another container, on another socket path, loads its models again; and
one store takes one live daemon per identity."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from kit.daemonkit import DaemonProcess, call, wait_for
from kit.inferkit import echo_carton

from cartonstore.cli.commands import main

pytestmark = pytest.mark.xdist_group("restore")


def files_only(root: Path, src: Path, name: str) -> None:
    source = echo_carton(src / name, label=name, runner="tensorflow", dtypes=["float32"])
    assert main(["add", str(source), "--name", name, "--root", str(root), "--progress", "none"]) == 0


def states(d: DaemonProcess) -> dict[str, str]:
    status, rows = call(d, "POST", "/v2/repository/index", json={})
    assert status == 200
    return {row["name"]: row["state"] for row in rows}


def ready(d: DaemonProcess) -> bool:
    return call(d, "GET", "/v2/health/ready")[0] == 200


def test_a_second_daemon_with_a_live_daemons_id_is_refused(short_tmp: Path) -> None:
    root = short_tmp / "root"
    with DaemonProcess(root, socket_path=short_tmp / "a.sock", listen=None, env={"CARTONSTORE_ID": "node-7"}):
        second = DaemonProcess(root, socket_path=short_tmp / "b.sock", listen=None, env={"CARTONSTORE_ID": "node-7"})
        with pytest.raises(RuntimeError) as refused:
            second.start()
        assert "exit 6" in str(refused.value)
        assert "another daemon on this store is running as server.id 'node-7'" in str(refused.value)
        assert not (short_tmp / "b.sock").exists()
        # another identity on the same store is welcome
        with DaemonProcess(root, socket_path=short_tmp / "c.sock", listen=None, env={"CARTONSTORE_ID": "node-8"}) as c:
            assert ready(c)
    # once the first is gone, its identity is free
    with DaemonProcess(root, socket_path=short_tmp / "b.sock", listen=None, env={"CARTONSTORE_ID": "node-7"}) as b:
        assert ready(b)


def test_a_bad_id_is_refused_naming_the_setting(short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "root", listen=None, env={"CARTONSTORE_ID": "two words"})
    with pytest.raises(RuntimeError) as refused:
        d.start()
    assert "CARTONSTORE_ID" in str(refused.value) and "server.id" in str(refused.value)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_daemon_on_another_socket_with_the_same_id_restores_its_models(short_tmp: Path, sig: int,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    root = short_tmp / "root"
    for name in ("m", "n"):
        files_only(root, short_tmp / "src", name)
    capsys.readouterr()
    ident = {"CARTONSTORE_ID": "node-7"}
    first = DaemonProcess(root, socket_path=short_tmp / "first.sock", listen=None, env=ident).start()
    try:
        assert call(first, "POST", "/v2/repository/models/m/load", json={})[0] == 200
    finally:
        first.stop(sig)
    # a daemon of another identity (by default its socket's path) has nothing of node-7's to restore
    with DaemonProcess(root, socket_path=short_tmp / "other.sock", listen=None) as other:
        assert wait_for(lambda: ready(other), 10)
        assert states(other) == {"m": "UNAVAILABLE", "n": "UNAVAILABLE"}
    with DaemonProcess(root, socket_path=short_tmp / "second.sock", listen=None, env=ident) as second:
        assert wait_for(lambda: ready(second), 30)
        assert states(second) == {"m": "READY", "n": "UNAVAILABLE"}
