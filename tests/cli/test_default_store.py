"""Where the store and the daemon's socket are when nothing names them.
Root's are the host's: /var/lib/cartonstore, its socket
/run/cartonstore/cartonstore.sock (a fresh machine's first `serve` makes
/run/cartonstore); another user's are in their cache, the socket in the
store. A root daemon and a root CLI meet there with no setting at all; a
real other user (setpriv) gets their own. CARTONSTORE_ROOT and
XDG_CACHE_HOME still win, and the socket of a store they name is in it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kit import hostview
from kit.daemonkit import wait_for
from kit.sandboxkit import runner_user, why_not

from cartonstore.client.wire import default_socket_path
from cartonstore.config.load import load_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CLI = [sys.executable, "-m", "cartonstore.cli"]
SYSTEM_ROOT = Path("/var/lib/cartonstore")
SYSTEM_SOCKET = Path("/run/cartonstore/cartonstore.sock")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment with nothing that names a store or a socket."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARTONSTORE_") and k != "XDG_CACHE_HOME"}
    return {**env, **extra}


def printed_locations(text: str) -> tuple[Path, Path]:
    """The store root and the socket `serve --print-config` says."""
    root = re.search(r'^root = "(.*)"$', text, re.M)
    sock = re.search(r'^socket = "(.*)"$', text, re.M)
    assert root and sock, text
    return Path(root[1]), Path(sock[1])


@pytest.fixture
def no_location_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [k for k in os.environ if k.startswith("CARTONSTORE_")] + ["XDG_CACHE_HOME"]:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="root's defaults: run as root")
def test_roots_defaults_are_the_hosts_store_and_run_socket(no_location_env: None, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    config = load_config(env={})
    assert (config.store.root, config.socket_path) == (SYSTEM_ROOT, SYSTEM_SOCKET)
    assert config.grpc_socket_path == SYSTEM_SOCKET.with_name("cartonstore.grpc.sock")
    assert default_socket_path() == SYSTEM_SOCKET
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    config = load_config(env={})
    assert (config.store.root, config.socket_path) == (tmp_path / "xdg" / "cartonstore",
                                                       tmp_path / "xdg" / "cartonstore" / "cartonstore.sock")
    assert default_socket_path() == config.socket_path
    monkeypatch.setenv("CARTONSTORE_ROOT", str(tmp_path / "mine"))
    assert load_config().socket_path == default_socket_path() == tmp_path / "mine" / "cartonstore.sock"


@pytest.mark.skipif(hostview.why_not() is not None, reason=str(hostview.why_not()))
def test_a_root_daemon_and_a_root_cli_meet_on_the_default_store(short_tmp: Path) -> None:
    log = short_tmp / "daemon.log"
    with open(log, "w") as stderr:
        # under a umask that would leave /run/cartonstore closed to the group members it is for
        serve = ["bash", "-c", 'umask 077 && exec "$@"', "serve", *CLI, "serve"]
        daemon = subprocess.Popen(hostview.argv(short_tmp / "view", serve), stderr=stderr,
                                  env=clean_env(CARTONSTORE_SANDBOX="none"))
    try:
        assert wait_for(lambda: " serving " in log.read_text() or daemon.poll() is not None, 30), log.read_text()
        assert daemon.poll() is None, log.read_text()
        assert f"serving {SYSTEM_ROOT} on unix:{SYSTEM_SOCKET}" in log.read_text()
        socket_seen = hostview.seen_by(daemon.pid, SYSTEM_SOCKET)
        assert socket_seen.is_socket()
        assert os.stat(socket_seen.parent).st_mode & 0o7777 == 0o755

        def cli(*args: str) -> subprocess.CompletedProcess:
            done = subprocess.run(hostview.joined(daemon.pid, [*CLI, *args]), env=clean_env(), capture_output=True,
                                  text=True, timeout=120, check=False)
            assert done.returncode == 0, (args, done.stderr)
            return done

        cli("add", str(FIXTURES / "quickstart.carton"))
        done = cli("infer", "double", "--input", "x=[[1, 2, 3, 4]]")
        assert "[[2. 4. 6. 8.]]" in done.stdout
        assert "loaded double into the daemon" in done.stderr   # answered by the daemon, not a runner of its own
        assert "double" in cli("ls").stdout
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    assert daemon.returncode == 0, log.read_text()


@pytest.mark.skipif(why_not("landlock") is not None, reason=str(why_not("landlock")))
def test_another_users_defaults_are_in_their_cache(short_tmp: Path) -> None:
    user = runner_user()
    assert user is not None
    home = short_tmp / "home"
    home.mkdir()
    show = ("from cartonstore.client.wire import default_socket_path; "
            "from cartonstore.cli import main; print('client', default_socket_path()); "
            "main(['serve', '--print-config'])")

    def as_user(**env: str) -> tuple[Path, Path, Path]:
        done = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                               "--", sys.executable, "-c", show],
                              env=clean_env(HOME=str(home), **env), capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, done.stderr
        client = re.search(r"^client (.*)$", done.stdout, re.M)
        assert client, done.stdout
        return (*printed_locations(done.stdout), Path(client[1]))

    store = home / ".cache" / "cartonstore"
    assert as_user() == (store, store / "cartonstore.sock", store / "cartonstore.sock")
    # a group member naming the host's store finds its daemon where root's is
    assert as_user(CARTONSTORE_ROOT=str(SYSTEM_ROOT)) == (SYSTEM_ROOT, SYSTEM_SOCKET, SYSTEM_SOCKET)
