"""The suite's Unix sockets do not depend on how long tmp_path is.

A socket path has at most 107 bytes, and tmp_path can be longer: pytest-xdist
adds popen-gwN/, and --basetemp or $TMPDIR can be anything. Sockets, and the
store roots daemons and runners bind theirs in, go under conftest.short_dir()
(issue 14: under `pytest -n auto` a notify socket beside tmp_path was too long).
This runs a small pytest with a --basetemp of some 150 bytes: the `daemon`
fixture (its notify socket, its API socket), with room under its root for
runner sockets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

INNER = '''
import asyncio

from cartonstore.server.runner_processes import daemon_run_dir, instance_socket_path
from kit.daemonkit import unix_session


def test_a_daemon_under_a_long_tmp_path(daemon, tmp_path, short_tmp):
    assert len(str(tmp_path)) > 150
    assert len(str(short_tmp)) < 30 and short_tmp.is_dir()

    async def live():
        async with unix_session(daemon.socket_path) as s, s.get("/v2/health/live") as r:
            return r.status
    assert asyncio.run(live()) == 200
    # A runner's socket fits under the daemon's root, hash-shortened name or not:
    # instance_socket_path raises when the directory leaves no room.
    run_dir = daemon_run_dir(daemon.root / "run" / "runners", "0123456789ab")   # named by the daemon's owner token
    assert instance_socket_path(run_dir, "model", "0123456789abcdef", 0).name == "model-01234567-0.sock"
    instance_socket_path(run_dir, "m" * 200, "0123456789abcdef", 0)
'''


def test_sockets_are_short_whatever_the_length_of_tmp_path(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    basetemp = tmp_path / ("long-basetemp-" + "x" * max(0, 150 - len(str(tmp_path))))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CARTONSTORE_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    # -p conftest: the suite's conftest as a plugin, for its fixtures (daemon, short_tmp).
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                        "--rootdir", str(tmp_path), "--basetemp", str(basetemp), "test_inner.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "1 passed" in p.stdout, p.stdout[-2000:]
