"""How a runner's sandbox is planned (server/runner_processes/sandbox.py), and the
loads it refuses: never silently unsandboxed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kit.daemonkit import DaemonProcess, call
from kit.inferkit import echo_carton, runner_sockets

from cartonstore.errors import InvalidInput
from cartonstore.server.runner_processes.sandbox import SandboxPolicy, _isolated, confine, python_paths, runner_identity

ARGV = [sys.executable, "-m", "cartonstore.runner.backends.python", "--socket", "/x.sock"]


def last_launcher(argv: list[str]) -> int:
    """Where the launcher that runs the runner is named (a root daemon's
    bubblewrap has one before it too, which enters its user namespace)."""
    return len(argv) - 1 - argv[::-1].index("cartonstore.system.confine")


def test_no_bubblewrap_where_it_is_asked_for_fails_naming_how_to_get_one(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))   # bwrap and setpriv are found on PATH: here, nowhere
    with pytest.raises(InvalidInput) as caught:
        confine(SandboxPolicy(mode="bwrap", user="nobody"), ARGV, model_dir=tmp_path, model="m", device="cpu",
                listen_fd=3, env={}, label="m")
    message = str(caught.value)
    assert "apt-get install bubblewrap" in message and 'sandbox = "none"' in message


@pytest.mark.skipif(os.geteuid() != 0, reason="runners change user only under a root daemon")
def test_a_root_daemon_needs_a_runner_user_that_exists_and_is_not_root() -> None:
    with pytest.raises(InvalidInput, match="does not exist.*useradd --system"):
        runner_identity(SandboxPolicy(user="no-such-user-here"))
    with pytest.raises(InvalidInput, match="runners never run as root"):
        runner_identity(SandboxPolicy(user="root"))
    with pytest.raises(InvalidInput, match="runners never run as root"):
        runner_identity(SandboxPolicy(user="0"))
    assert runner_identity(SandboxPolicy(user="nobody"))[0] != 0


def test_the_runner_gets_an_allow_listed_environment_and_an_isolated_python(short_tmp: Path) -> None:
    short_tmp.chmod(0o711)   # as a store root is: the runner user may pass
    model_dir = short_tmp / "model"
    model_dir.mkdir()
    env = {"CARTONSTORE_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "k", "PYTHONPATH": "/evil", "LD_PRELOAD": "/evil.so",
           "OMP_NUM_THREADS": "2", "LANG": "C.UTF-8", "CUDA_VISIBLE_DEVICES": "", "PATH": "/home/me/bin:/usr/bin"}
    try:
        c = confine(SandboxPolicy(mode="auto", user="nobody"), ARGV, model_dir=model_dir, model="m", device="cpu",
                    listen_fd=3, env=env, label="plan-test")
    except InvalidInput as e:
        pytest.skip(f"no sandbox here: {e}")
    try:
        assert set(c.env) == {"OMP_NUM_THREADS", "LANG", "CUDA_VISIBLE_DEVICES", "PATH", "HOME", "TMPDIR"}
        assert c.env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
        runner = c.argv[c.argv.index("--", last_launcher(c.argv)) + 1:]
        assert runner[:3] == [sys.executable, "-I", "-m"]
    finally:
        c.release()


def test_isolation_is_added_once_and_only_to_this_python() -> None:
    assert _isolated(ARGV)[:2] == [sys.executable, "-I"]
    assert _isolated(_isolated(ARGV)) == _isolated(ARGV)
    assert _isolated(["/opt/serve", "--socket", "x"]) == ["/opt/serve", "--socket", "x"]


def test_what_a_runner_may_read_is_python_not_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    paths = python_paths()
    assert str(tmp_path) not in paths and os.path.realpath(sys.prefix) in paths


@pytest.mark.slow
def test_a_daemon_with_sandbox_none_says_so(short_tmp: Path) -> None:
    with DaemonProcess(short_tmp / "root", env={"CARTONSTORE_SANDBOX": "none"}) as d:
        source = echo_carton(short_tmp / "echo", dtypes=["float32"])
        assert call(d, "POST", "/v2/repository/models/echo/load", json={"parameters": {"source": str(source)}})[0] == 200
        (row,) = call(d, "POST", "/v2/repository/index", json={})[1]
        assert row["sandbox"] == "none"


def test_a_load_with_no_sandbox_to_be_had_fails_naming_how_and_leaves_no_runner(short_tmp: Path) -> None:
    config = short_tmp / "cartonstore.toml"
    config.write_text('[runners]\nuser = "nobody"\n')
    with DaemonProcess(short_tmp / "root", extra_args=["--config", str(config)],
                       env={"CARTONSTORE_SANDBOX": "bwrap", "PATH": str(short_tmp)}) as d:
        source = echo_carton(short_tmp / "echo", dtypes=["float32"])
        status, body = call(d, "POST", "/v2/repository/models/echo/load", json={"parameters": {"source": str(source)}})
        assert status == 400 and "install bubblewrap" in body["error"], body
        (row,) = call(d, "POST", "/v2/repository/index", json={})[1]
        assert row["state"] == "UNAVAILABLE"
        assert not runner_sockets(d.root)


def test_cgroups_a_killed_daemon_left_are_removed_and_live_ones_kept() -> None:
    from cartonstore.system import cgroups

    made = cgroups.create("cartonstore-test-probe", max_processes=8, memory_limit=None)
    if made is None:
        pytest.skip("no cgroup this process may make here")
    made.remove()
    gone = cgroups.create("cartonstore-4194303-gone.g1-0", max_processes=8, memory_limit=None)   # no such pid
    live = cgroups.create(f"cartonstore-{os.getpid()}-live.g1-0", max_processes=8, memory_limit=None)
    try:
        removed = cgroups.remove_stale("cartonstore-")
        assert set(gone.dirs) <= set(removed) and not set(live.dirs) & set(removed)
        assert all(not d.exists() for d in gone.dirs) and all(d.exists() for d in live.dirs)
    finally:
        gone.remove()
        live.remove()


def test_landlock_alone_is_refused_for_a_runner_of_the_daemons_own_user(tmp_path: Path, monkeypatch) -> None:
    """Landlock stops no chmod and no connect() to a socket by path: a
    runner keeping the daemon's uid could chmod the store's blobs and use
    its API socket. Without bubblewrap, only a runner of another uid may
    run under Landlock alone."""
    from cartonstore.server.runner_processes.sandbox import mechanisms
    from cartonstore.system.landlock import abi_version

    if abi_version() < 1:
        pytest.skip("no Landlock in this kernel")
    monkeypatch.setenv("PATH", str(tmp_path))   # no bubblewrap on PATH
    for mode in ("auto", "landlock"):
        with pytest.raises(InvalidInput, match="only Landlock is here.*install bubblewrap"):
            mechanisms(SandboxPolicy(mode=mode), None)
    if abi_version() >= 6:
        assert mechanisms(SandboxPolicy(mode="landlock"), (65534, 65534)) == (None, False, abi_version())


@pytest.mark.parametrize(("args", "status", "said"), [
    (["{not json", "--", "true"], 3, "cannot confine the runner"),
    (["[]", "--", "true"], 3, "a plan is a JSON object"),
    (['{"rlimits": {"NO_SUCH_LIMIT": 1}}', "--", "true"], 3, "cannot confine the runner"),
    (['{"chdir": "/no/such/dir"}', "--", "true"], 3, "/no/such/dir"),
    (['{"seccomp": {"inet": false}}', "--", "true"], 3, "cannot confine the runner"),
    (['{}', "--", "/no/such/program"], 3, "/no/such/program"),
    (['{}'], 2, "usage"),
])
def test_the_launcher_refuses_a_plan_it_cannot_apply_and_runs_nothing(args: list[str], status: int, said: str) -> None:
    p = subprocess.run([sys.executable, "-I", "-m", "cartonstore.system.confine", *args], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == status and said in p.stderr, (p.returncode, p.stderr)


def test_the_launcher_fails_when_landlock_does_not_hold_what_the_plan_requires() -> None:
    from cartonstore.system.landlock import abi_version

    if abi_version() < 1:
        pytest.skip("no Landlock in this kernel")
    plan = json.dumps({"landlock": {"read": ["/usr", "/lib", "/lib64", "/etc"], "require": ["fs", "time-travel"]}})
    p = subprocess.run([sys.executable, "-I", "-m", "cartonstore.system.confine", plan, "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and "Landlock did not take hold of time-travel" in p.stderr, p.stderr
    ok = json.dumps({"landlock": {"read": ["/usr", "/lib", "/lib64", "/etc", "/bin"], "require": ["fs"]}})
    p = subprocess.run([sys.executable, "-I", "-m", "cartonstore.system.confine", ok, "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "landlock:fs" in p.stderr and "held" in p.stderr, p.stderr


def _launcher(plan: dict) -> list[str]:
    return [sys.executable, "-I", "-m", "cartonstore.system.confine", json.dumps(plan), "--"]


def test_the_launcher_empties_the_bounding_set_or_fails_naming_the_capability_that_stays() -> None:
    """As root (Landlock alone) it drops them all; a launcher that is not
    root and finds one left (bubblewrap that kept it) cannot, and runs nothing."""
    from kit.sandboxkit import runner_user, why_not

    if (why := why_not("landlock")) is not None:
        pytest.skip(why)
    user = runner_user()
    p = subprocess.run([*_launcher({"drop_caps": True, "user": [user.pw_uid, user.pw_gid]}), "grep", "^Cap",
                        "/proc/self/status"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "caps:none" in p.stderr, p.stderr
    assert {line.split()[1] for line in p.stdout.splitlines()} == {"0" * 16}, p.stdout
    p = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--",
                        *_launcher({"drop_caps": True}), "true"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and "capability 0 stays in the bounding set" in p.stderr, p.stderr


HOLD_A_KEY = r"""
import ctypes, sys
from cartonstore.system.seccomp import SYSCALLS, machine
key = ctypes.CDLL(None, use_errno=True).syscall(ctypes.c_long(SYSCALLS[machine()]["add_key"]), b"user", b"runner-a",
                                                b"a secret", ctypes.c_size_t(8), ctypes.c_int(-3))
print(key, flush=True)
sys.stdin.read()
"""
READ_THE_KEY = r"""
import ctypes, errno, sys
from cartonstore.system.keyring import keyctl
buf = ctypes.create_string_buffer(64)
try:
    keyctl(11, ctypes.c_int(int(sys.argv[1])), buf, ctypes.c_size_t(64))   # KEYCTL_READ
    print("read " + buf.value.decode())
except OSError as e:
    print(errno.errorcode[e.errno])
"""
# Two runners of one user started by one daemon: the first adds a key to its session keyring and holds
# it; the second tries to read it. In a session keyring of the driver's own, not the tests'.
TWO_RUNNERS = r"""
import json, subprocess, sys
from cartonstore.system.keyring import join_new_session
join_new_session()
launcher, hold, read = json.loads(sys.argv[1])
a = subprocess.Popen([*launcher, sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
key = a.stdout.readline().strip()
b = subprocess.run([*launcher, sys.executable, "-c", read, key], capture_output=True, text=True, timeout=60)
a.stdin.close()
a.wait(60)
print(key, b.stdout.strip() or b.stderr.strip())
"""


def test_a_runner_cannot_read_a_key_another_runner_added_to_its_session_keyring() -> None:
    """The keyring layer alone (the seccomp filter denies keyctl besides):
    each runner gets a session keyring of its own, not the daemon's, which
    the key of one would otherwise be in, for the other to read."""
    from kit.sandboxkit import runner_user, why_not

    from cartonstore.system.keyring import unavailable

    if (why := why_not("landlock") or unavailable()) is not None:
        pytest.skip(why)
    user = runner_user()
    launcher = _launcher({"user": [user.pw_uid, user.pw_gid], "keyring": True})
    p = subprocess.run([sys.executable, "-c", TWO_RUNNERS, json.dumps([launcher, HOLD_A_KEY, READ_THE_KEY])],
                       capture_output=True, text=True, timeout=120)
    key, said = p.stdout.split(maxsplit=1)
    assert int(key) > 0 and said.strip() == "EACCES", p.stdout + p.stderr


def test_inet_sockets_and_sysv_ipc_are_planned_for_bubblewrap_and_networked_models_only(short_tmp: Path) -> None:
    from kit.sandboxkit import runner_user, why_not

    if (why := why_not("landlock")) is not None:
        pytest.skip(why)
    short_tmp.chmod(0o711)
    (short_tmp / "model").mkdir()
    planned = {}
    for mode, model in (("landlock", "m"), ("landlock", "net"), ("bwrap", "m")):
        policy = SandboxPolicy(mode=mode, user=runner_user().pw_name, network=frozenset({"net"}))
        try:
            c = confine(policy, ARGV, model_dir=short_tmp / "model", model=model, device="cpu", listen_fd=3, env={},
                        label=f"plan-{mode}-{model}")
        except InvalidInput as e:
            pytest.skip(f"no {mode} sandbox here: {e}")
        c.release()
        plan = json.loads(c.argv[last_launcher(c.argv) + 1])
        planned[mode, model] = plan["seccomp"], plan["keyring"], plan["drop_caps"], c.layers[-3:]
    held = (True, True, ("caps:none", "seccomp", "keyring"))
    assert planned == {("landlock", "m"): ({"inet": False, "netlink_route": False, "ipc": False}, *held),
                       ("landlock", "net"): ({"inet": True, "netlink_route": False, "ipc": False}, *held),
                       ("bwrap", "m"): ({"inet": True, "netlink_route": True, "ipc": True}, *held)}


def test_a_layer_the_kernel_cannot_give_is_named_in_the_start_line() -> None:
    from cartonstore.server.runner_processes.sandbox import Host

    policy = SandboxPolicy(user="cartonstore-runner")
    full = Host((999, 999), "/usr/bin/bwrap", True, 7)
    assert full.describe(policy) == ("bubblewrap with Landlock ABI 7 and a private /dev/shm of 256 MiB each, as "
                                     "cartonstore-runner, no capabilities, a seccomp filter, a session keyring each")
    lacking = Host((999, 999), "/usr/bin/bwrap", True, 7, no_seccomp="this kernel filters no syscalls",
                   no_keyring="this kernel has no keyrings")
    assert lacking.describe(policy).endswith("NO seccomp filter (this kernel filters no syscalls), NO keyring of "
                                             "their own (this kernel has no keyrings)")
