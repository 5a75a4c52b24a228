"""`cartonstore load NAME [--config JSON] [--wait]` and `cartonstore unload
NAME` through a real daemon's Unix socket (issue 38, item 6), with the
CLI's exit statuses: no daemon 6 naming the socket, an unknown model 3,
a --config that is no JSON object 4 (the daemon never asked), a config
the daemon refuses its message; `rm` of a loaded model names `cartonstore
unload`, and `gc` over its budget names what is loaded and leased."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, FIXTURES, short_dir
from kit.clikit import run
from kit.daemonkit import DaemonProcess, call

from cartonstore.store import Store

QUICK = FIXTURES / "quickstart.carton"


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    with short_dir() as base:
        with Store(base / "root") as s:
            s.add(FIXTURE_CARTON, name="tiny")
            s.add(QUICK, name="quick")
        with DaemonProcess(base / "root", listen=None, extra_args=["--no-restore"]) as d:
            yield d


def cli(d: DaemonProcess, capsys, *argv: str) -> tuple[int, str, str]:
    """argv on the daemon's store, whose socket is the store's default one."""
    return run(capsys, *argv, "--root", str(d.root))


def test_without_a_daemon_load_and_unload_exit_6_naming_the_socket(tmp_path: Path, capsys) -> None:
    for argv in (["load", "tiny"], ["unload", "tiny"]):
        code, out, err = run(capsys, *argv, "--root", str(tmp_path), "--socket", str(tmp_path / "none.sock"))
        assert (code, out) == (6, ""), err
        assert err == (f"cartonstore {argv[0]}: error: no cartonstore daemon at {tmp_path / 'none.sock'}: "
                       "is `cartonstore serve` running?\n")


@pytest.mark.parametrize("argv,code,line", [
    (["load", "nope"], 3, "cartonstore load: error: failed to load 'nope': unknown model 'nope': not in the store"),
    (["unload", "nope"], 3, "cartonstore unload: error: failed to unload 'nope': Request for unknown model: 'nope' "
                            "is not found"),
    (["load", "tiny", "--config", "{max_batch_size: 8}"], 4,
     "cartonstore load: error: --config is not JSON (Expecting property name enclosed in double quotes: line 1 "
     """column 2 (char 1)): give Triton's model config as a JSON object, e.g. '{"max_batch_size": 8}'"""),
    (["load", "tiny", "--config", "[8]"], 4,
     "cartonstore load: error: --config must be a JSON object (Triton's model config), got list"),
    (["load", "tiny", "--config", '{"max_batch_size": -3}'], 4,
     "cartonstore load: error: failed to load 'tiny': config: 'max_batch_size' must be an integer in [0, 1048576], "
     "not -3"),
])
def test_each_mistake_gets_its_line_and_status(daemon: DaemonProcess, capsys, argv: list[str], code: int,
                                               line: str) -> None:
    got, out, err = cli(daemon, capsys, *argv)
    assert (got, out) == (code, ""), err
    assert err.startswith(line) and err.count("\n") == 1, err
    assert call(daemon, "GET", f"/v2/models/{argv[1]}/ready")[0] == 400   # nothing loaded by a mistake


def test_load_then_unload(daemon: DaemonProcess, capsys) -> None:
    code, out, err = cli(daemon, capsys, "load", "tiny")
    assert code == 0, err
    assert out.splitlines() == [f"loaded tiny: version {FIXTURE_DIGEST[:12]} is ready", FIXTURE_DIGEST]
    assert call(daemon, "GET", "/v2/models/tiny/ready")[0] == 200
    code, out, err = cli(daemon, capsys, "load", "tiny", "--json")   # loaded as asked already: nothing to do
    assert code == 0 and json.loads(out) == {"name": "tiny", "manifest_sha256": FIXTURE_DIGEST, "state": "READY"}

    code, _, err = cli(daemon, capsys, "rm", "tiny")
    assert code == 7 and "loaded as tiny by the daemon: unload it first: cartonstore unload tiny" in err, err

    status, lease = call(daemon, "POST", "/v1/leases", json={"model": "quick", "ttl": 60})
    assert status == 200, lease
    code, out, err = cli(daemon, capsys, "gc", "--max-size", "1K", "--dry-run")
    assert code == 0, err
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("the store would stay over its budget: "))
    assert lines[at].endswith(", max_size 1.0 KiB; gc never takes what is loaded or leased:"), lines
    assert lines[at + 1].startswith("  tiny 1.4 MiB: loaded as tiny") and lines[at + 2].startswith("  quick "), lines
    assert lines[at + 2].endswith(": 1 lease(s)"), lines
    call(daemon, "DELETE", f"/v1/leases/{lease['lease']}")

    code, out, err = cli(daemon, capsys, "unload", "tiny")
    assert (code, out) == (0, "unloaded tiny\n"), err
    assert call(daemon, "GET", "/v2/models/tiny/ready")[0] == 400


def test_load_wait_waits_for_a_daemon_that_is_starting(capsys) -> None:
    with short_dir() as base:
        with Store(base / "root") as s:
            s.add(QUICK, name="quick")
        sock = base / "root" / "cartonstore.sock"
        waiting = subprocess.Popen([sys.executable, "-m", "cartonstore.cli", "load", "quick", "--wait", "--root",
                                    str(base / "root"), "--socket", str(sock)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            with DaemonProcess(base / "root", listen=None, extra_args=["--no-restore"]) as d:
                out, err = waiting.communicate(timeout=120)
                assert waiting.returncode == 0, err
                assert out.splitlines()[0].startswith("loaded quick: version ")
                assert call(d, "GET", "/v2/models/quick/ready")[0] == 200
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait()
