"""A root daemon's first run: its Python (a pyenv-like install and a
virtualenv of it) and its store under a directory of mode 0700, as /root is,
with the runner user that exists and with a transient uid. Under bubblewrap
a python and an ONNX model load sandboxed and infer (what a runner reads is
bound in as root); each runner has a /dev/shm of its own where POSIX
semaphores work and nothing of the host's or another runner's is seen.
Under Landlock alone the start names what the runner's uid cannot reach,
the Python and the store, one line each. A transient uid is in neither
/etc/passwd nor /etc/group, and two daemons get two."""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import short_dir
from kit.daemonkit import DaemonProcess, call, wait_for
from kit.inferkit import echo_carton, onnx_carton
from kit.sandboxkit import runner_user

from cartonstore.system.transient_uid import FIRST, LAST, LOCK_DIR

pytestmark = pytest.mark.xdist_group("sandbox_root_first_run")

# In get_model(), one line: POSIX semaphores (sem_open in /dev/shm) work, and the runner's /dev/shm holds
# what it wrote there and nothing else (not the host's file, not another runner's).
SHM_STARTUP = ("import multiprocessing, os, _multiprocessing; multiprocessing.Semaphore(); "
               "open('/dev/shm/mine-{label}', 'w').write('x'); "
               "seen = sorted(os.listdir('/dev/shm')); "
               "assert seen == ['mine-{label}'], '/dev/shm holds %r' % seen")


def why_not_here() -> str | None:
    if os.geteuid() != 0:
        return "a root daemon's runners change user: run as root"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    if runner_user() is None:
        return "no unprivileged user (cartonstore-runner or nobody) to run runners as"
    return None


def python_under(base: Path) -> Path:
    """A Python of its own under ``base`` (as pyenv puts one under /root:
    this interpreter's binary and standard library, hardlinked), a
    virtualenv of it beside, whose site-packages is a link to this test's
    (numpy, onnxruntime, cartonstore). Returns the virtualenv's python."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    real = Path(os.path.realpath(sys.executable))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    prefix = base / "py"
    (prefix / "bin").mkdir(parents=True)
    os.link(real, prefix / "bin" / version)
    (prefix / "lib").mkdir()
    subprocess.run(["cp", "-al", str(stdlib), str(prefix / "lib" / version)], check=True, timeout=120)
    venv = base / "venv"
    subprocess.run([str(prefix / "bin" / version), "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True, timeout=120)
    site = venv / "lib" / version / "site-packages"
    site.rmdir()
    site.symlink_to(os.path.realpath(sysconfig.get_paths()["purelib"]))
    python = venv / "bin" / "python3"
    probe = subprocess.run([str(python), "-c", "import sys, cartonstore, numpy; print(sys.base_prefix)"],
                           check=False, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0 and probe.stdout.strip() == str(prefix), probe.stdout + probe.stderr
    return python


class VenvDaemon(DaemonProcess):
    """A daemon run by the virtualenv's python (its runners run by it too)."""

    def __init__(self, python: Path, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.python = python

    def argv(self) -> list[str]:
        return [str(self.python), *super().argv()[1:]]


def start_line(d: DaemonProcess) -> str:
    log = d.log_file.read_text()
    said = [line for line in log.splitlines() if "runners run sandboxed: " in line]
    assert said, log[-3000:]
    return said[0]


@pytest.fixture(scope="module")
def hidden() -> Iterator[tuple[Path, Path]]:
    """A base directory of mode 0700 holding a Python and its virtualenv."""
    if (why := why_not_here()) is not None:
        pytest.skip(why)
    with short_dir() as base:
        python = python_under(base)
        base.chmod(0o700)
        yield base, python


def daemon_in(base: Path, python: Path, name: str, runners: str, **env: str) -> VenvDaemon:
    config = base / f"{name}.toml"
    config.write_text(f"[runners]\n{runners}\n")
    return VenvDaemon(python, base / name / "store", socket_path=base / name / "d.sock",
                      extra_args=["--config", str(config)], env=env, log_file=base / f"{name}.log")


def load(d: DaemonProcess, name: str, source: Path) -> tuple[int, object]:
    return call(d, "POST", f"/v2/repository/models/{name}/load", json={"parameters": {"source": str(source)}})


@pytest.mark.parametrize("user", ["named", "transient"])
def test_a_python_and_an_onnx_model_load_under_bubblewrap_from_a_0700_directory(hidden, user: str) -> None:
    base, python = hidden
    setting = f'user = "{runner_user().pw_name}"' if user == "named" else 'user = ""'
    d = daemon_in(base, python, f"bwrap-{user}", f'sandbox = "bwrap"\n{setting}\nmemory_limit = "1G"',
                  CARTONSTORE_SANDBOX="bwrap")
    host_file = Path("/dev/shm") / f"cs-host-{os.getpid()}-{user}"
    host_file.write_text("the host's")
    try:
        with d:
            said = start_line(d)
            assert "bubblewrap with Landlock" in said and "a private /dev/shm of 1 GiB each" in said, said
            models = {"echo": echo_carton(base / f"echo-{user}", dtypes=["float32"]),
                      "affine": onnx_carton(base / f"affine-{user}"),
                      "shm-a": echo_carton(base / f"shm-a-{user}", label="a", dtypes=["float32"],
                                           startup=SHM_STARTUP.format(label="a")),
                      "shm-b": echo_carton(base / f"shm-b-{user}", label="b", dtypes=["float32"],
                                           startup=SHM_STARTUP.format(label="b"))}
            for name, source in models.items():
                status, body = load(d, name, source)
                assert status == 200, (name, body, d.log_file.read_text()[-3000:])
            status, body = call(d, "POST", "/v2/models/echo/infer", json={
                "inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}]})
            assert status == 200 and body["outputs"][0]["data"] == [1.5, 2.5], body
            status, body = call(d, "POST", "/v2/models/affine/infer", json={
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 1, 2, 3]}]})
            assert status == 200 and body["outputs"][0]["data"] == [1, 3, 5, 7], body
            rows = {row["name"]: row for row in call(d, "POST", "/v2/repository/index", json={})[1]}
            layers = rows["affine"]["sandbox"].split("+")
            assert layers[:2] == ["bwrap", "landlock"] and {"caps:none", "seccomp", "keyring"} <= set(layers), layers
            uid = runner_uid(rows["echo"]["pids"][0])
            if user == "named":
                assert "uid" in layers and f"as {runner_user().pw_name}," in said, (layers, said)
                assert uid == runner_user().pw_uid
            else:
                assert f"uid:transient({uid})" in layers and f"as transient uid {uid} (runners.user = \"\")" in said
            print(f"layers, bubblewrap, {user} user: {rows['affine']['sandbox']}\nstart: {said}")
        assert not list((base / f"bwrap-{user}" / "store").glob("models/*/model/mine-*"))
    finally:
        host_file.unlink()


def runner_uid(pid: int) -> int:
    """The real uid of the runner under ``pid`` (bubblewrap's processes, as
    root of its namespace, aside): its deepest descendant's."""
    while True:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if not children:
            break
        pid = int(children[-1])
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":\t" in line)
    return int(status["Uid"].split()[0])


def test_landlock_alone_names_at_start_what_the_runner_uid_cannot_reach(hidden) -> None:
    from cartonstore.system.landlock import abi_version

    if abi_version() < 6:
        pytest.skip("Landlock alone needs ABI 6 (Linux 6.12)")
    base, python = hidden
    d = daemon_in(base, python, "landlock", 'sandbox = "landlock"\nuser = ""', CARTONSTORE_SANDBOX="landlock")
    with d:
        log = d.log_file.read_text()
        said = start_line(d)
        assert "Landlock ABI" in said and "NO /dev/shm" in said and "as transient uid" in said, said
        lines = [line for line in log.splitlines() if "loads will fail: under Landlock alone" in line]
        assert len(lines) == 2, log[-3000:]
        python_line, store_line = lines
        blocked = f"{base} (mode 0700, owner uid 0)"
        assert f"cannot reach its Python, {python}: {blocked}" in python_line, python_line
        assert f"cannot reach the store's models, {base / 'landlock' / 'store' / 'models'}: {blocked}" in store_line
        status, body = load(d, "echo", echo_carton(base / "echo-landlock", dtypes=["float32"]))
        assert status == 400 and "cannot reach its Python" in body["error"] and str(base) in body["error"], body


def transient_of(d: DaemonProcess) -> int:
    said = start_line(d)
    found = re.search(r"as transient uid (\d+) \(runners\.user = \"\"\)", said)
    assert found, said
    return int(found.group(1))


def test_a_transient_uid_is_nobodys_and_two_daemons_get_two() -> None:
    if (why := why_not_here()) is not None:
        pytest.skip(why)
    with short_dir() as base:
        base.chmod(0o711)
        config = base / "cartonstore.toml"
        config.write_text('[runners]\nuser = ""\n')
        first, second = (DaemonProcess(base / name, extra_args=["--config", str(config)],
                                       env={"CARTONSTORE_SANDBOX": "auto"}, log_file=base / f"{name}.log")
                         for name in ("one", "two"))
        with first, second:
            uids = transient_of(first), transient_of(second)
            assert uids[0] != uids[1], uids
            for uid in uids:
                assert FIRST <= uid <= LAST
                with pytest.raises(KeyError):
                    pwd.getpwuid(uid)
                with pytest.raises(KeyError):
                    grp.getgrgid(uid)
                assert (LOCK_DIR / f"{uid}.lock").is_file()
            status, body = load(first, "echo", echo_carton(base / "echo", dtypes=["float32"]))
            assert status == 200, body
            (row,) = call(first, "POST", "/v2/repository/index", json={})[1]
            assert f"uid:transient({uids[0]})" in row["sandbox"].split("+"), row["sandbox"]
            assert wait_for(lambda: runner_uid(row["pids"][0]) == uids[0], timeout=10)


UNIT = Path(__file__).resolve().parents[2] / "systemd" / "cartonstore.service"


def unit_bounding_set() -> list[str]:
    """The capabilities systemd/cartonstore.service leaves the daemon."""
    (line,) = [line for line in UNIT.read_text().splitlines() if line.startswith("CapabilityBoundingSet=")]
    return line.split("=", 1)[1].split()


class BoundedDaemon(DaemonProcess):
    """A daemon whose capability bounding set is ``caps`` alone, as a unit's
    CapabilityBoundingSet leaves it (setpriv, util-linux)."""

    def __init__(self, caps: list[str], *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.caps = caps

    def argv(self) -> list[str]:
        names = ",".join(["-all", *(f"+{cap.removeprefix('CAP_').lower()}" for cap in self.caps)])
        return ["setpriv", f"--bounding-set={names}", "--inh-caps=-all", *super().argv()]


@pytest.mark.parametrize("dropped", [(), ("CAP_SETFCAP",), ("CAP_SETFCAP", "CAP_SETPCAP")],
                         ids=["the unit's", "without CAP_SETFCAP", "without CAP_SETFCAP and CAP_SETPCAP"])
def test_the_units_capabilities_sandbox_runners_and_without_them_the_start_says_why(dropped: tuple[str, ...]) -> None:
    """Under the capabilities the systemd unit keeps, a root daemon (not
    CAP_DAC_OVERRIDE: its model directories are read-only to it too) builds
    a model and its runner gets bubblewrap (root is mapped in each runner's
    user namespace, which the kernel allows only with CAP_SETFCAP) and
    answers. Without CAP_SETFCAP it falls back to Landlock alone and says
    why, naming the capability, and runners.sandbox = "bwrap" refuses; with
    CAP_SETPCAP gone too, Landlock alone cannot empty a runner's bounding
    set: the start says so and a load fails naming it."""
    if (why := why_not_here()) is not None:
        pytest.skip(why)
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    bounding = [cap for cap in unit_bounding_set() if cap not in dropped]
    with short_dir() as base:
        base.chmod(0o711)
        d = BoundedDaemon(bounding, base / "store", env={"CARTONSTORE_SANDBOX": "auto"}, log_file=base / "d.log")
        with d:
            status, body = load(d, "echo", echo_carton(base / "echo", dtypes=["float32"]))
            log = d.log_file.read_text()
            if "CAP_SETPCAP" in dropped:
                assert "loads that run model code will fail" in log and "CAP_SETPCAP" in log, log[-3000:]
                assert status == 400 and "CAP_SETPCAP" in body["error"], body
                return
            assert status == 200, (body, log[-3000:])
            said = start_line(d)
            status, answer = call(d, "POST", "/v2/models/echo/infer", json={
                "inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}]})
            assert status == 200 and answer["outputs"][0]["data"] == [1.5, 2.5], answer
            (row,) = call(d, "POST", "/v2/repository/index", json={})[1]
            layers = row["sandbox"].split("+")
            if not dropped:
                assert "bubblewrap with Landlock" in said and layers[0] == "bwrap", (said, layers)
                return
            assert "Landlock ABI" in said and "bubblewrap is installed but cannot run here" in said, said
            assert "CAP_SETFCAP" in said and layers[0] == "landlock", (said, layers)
            assert "bubblewrap cannot run here, so runners get Landlock alone" in log
        strict = BoundedDaemon(bounding, base / "strict", env={"CARTONSTORE_SANDBOX": "bwrap"},
                               log_file=base / "strict.log")
        with strict:
            status, body = load(strict, "echo", echo_carton(base / "echo-strict", dtypes=["float32"]))
            assert status == 400 and "CAP_SETFCAP" in body["error"], body
