"""A model cannot hurt the host: a hostile python carton, loaded by a real
daemon running as root, tries each escape on request, under bubblewrap
(with Landlock inside) and under Landlock alone. Every attempt fails, a
well-behaved model beside it answers every request throughout, the daemon
survives, and `cartonstore verify` is clean afterwards.

Runners run as an unprivileged user when the daemon is root, so these tests
need root and a Python that user may execute (a pyenv under /root is not:
they skip, saying so; .ci/run makes its virtualenv from Debian's python3).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kit.daemonkit import DaemonProcess, call, wait_for
from kit.hostile import hostile_carton
from kit.inferkit import echo_carton, spares_run
from kit.sandboxkit import runner_user, why_not

# hostile models in every sandbox, each test its daemons and runners. One
# worker: each xdist worker that ran one of these tests would start its own
# root daemon, sandboxed runners and spares for every sandbox of `node`.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sandbox")]

SECRET = "s3cret-peer-token"
# Run as the daemon's argv: a session keyring of its own holding a key (as a host's login session may hold
# one), its id written to argv[1]; then the daemon, by exec (same pid).
PLANT_KEY = r"""
import ctypes, os, sys
from cartonstore.system.keyring import join_new_session
from cartonstore.system.seccomp import SYSCALLS, machine
join_new_session()
payload = b"the daemon's session key"
key = ctypes.CDLL(None, use_errno=True).syscall(ctypes.c_long(SYSCALLS[machine()]["add_key"]), b"user",
                                                b"cartonstore-test", payload, ctypes.c_size_t(len(payload)),
                                                ctypes.c_int(-3))   # KEY_SPEC_SESSION_KEYRING
if key < 0:
    sys.exit("add_key: %s" % os.strerror(ctypes.get_errno()))
with open(sys.argv[1], "w") as f:
    f.write(str(key))
os.execv(sys.argv[2], sys.argv[2:])
"""


class KeyedDaemon(DaemonProcess):
    """A daemon whose session keyring holds a key, ``planted_key``."""

    def argv(self) -> list[str]:
        return [sys.executable, "-c", PLANT_KEY, str(self.root.parent / "planted-key"), *super().argv()]

    @property
    def planted_key(self) -> int:
        return int((self.root.parent / "planted-key").read_text())


def runner_marker(d: DaemonProcess, name: str, digests: dict[str, str]) -> str:
    """What the command lines of the model's runner processes (and of what
    they fork) hold: its digest, or for a pre-warmed spare, its slot."""
    row = next(r for r in call(d, "POST", "/v2/repository/index", json={})[1] if r["name"] == name)
    cmdline = Path(f"/proc/{row['pids'][0]}/cmdline").read_bytes().decode()
    slot = re.search(r"/run/slots/[^\x00]+", cmdline)
    return cmdline[:slot.end()].rsplit("\x00", 1)[-1] if slot else digests[name]


def order(d: DaemonProcess, what: str, model: str = "hostile") -> tuple[int, str]:
    status, body = call(d, "POST", f"/v2/models/{model}/infer",
                        json={"inputs": [{"name": "x_string", "datatype": "BYTES", "shape": [1, 1], "data": [what]}]})
    if status != 200:
        return status, json.dumps(body)
    return status, body["outputs"][0]["data"][0]


def echo_once(d: DaemonProcess) -> int:
    return call(d, "POST", "/v2/models/echo/infer",
                json={"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]})[0]


class Steady:
    """Infers on the well-behaved model over and over while it is entered;
    every status it got, on leaving."""

    def __init__(self, d: DaemonProcess) -> None:
        self.d, self.statuses, self.stop = d, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            self.statuses.append(echo_once(self.d))
            time.sleep(0.02)

    def __enter__(self) -> Steady:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.fixture(scope="module", params=["bwrap", "landlock", "bwrap, prewarmed", "landlock, prewarmed"])
def node(request, tmp_path_factory) -> Iterator[Any]:
    """A root daemon whose runners are sandboxed by ``request.param``, with
    a hostile model, a well-behaved one and a victim model loaded. Prewarmed:
    the hostile model is loaded first, into a pre-warmed spare (a runner
    started before any load, and handed its model), which must hold it the same."""
    from conftest import short_dir

    mode, _, prewarmed = request.param.partition(", ")
    if (why := why_not(mode)) is not None:
        pytest.skip(why)
    user = runner_user()
    with short_dir() as base:
        base.chmod(0o711)   # as a store root is (0755): the runner user may pass, not list
        secret = base / "peer-token"
        secret.write_text(SECRET)
        secret.chmod(0o644)    # readable by anyone: only the sandbox keeps it from the model
        config = base / "cartonstore.toml"
        config.write_text(f'[peers]\ntoken_file = "{secret}"\n[runners]\nsandbox = "{mode}"\n'
                          f'user = "{user.pw_name}"\nmax_processes = 512\nmemory_limit = "1G"\n'
                          + ('prewarm = ["python"]\n' if prewarmed else ''))
        d = KeyedDaemon(base / "root", extra_args=["--config", str(config)], env={"CARTONSTORE_SANDBOX": mode},
                        log_file=base / "daemon.log")
        with d:
            models = [("echo", echo_carton(base / "echo", dtypes=["float32"])),
                      ("victim", echo_carton(base / "victim", label="victim", dtypes=["float32"])),
                      ("hostile", hostile_carton(base / "hostile"))]
            if prewarmed:
                models.reverse()
                assert wait_for(lambda: "cartonstore_runner_spares{" in call(d, "GET", "/metrics")[1]
                                and spares_run(d.root), timeout=30)
            asked = time.time()
            for name, source in models:
                status, body = call(d, "POST", f"/v2/repository/models/{name}/load",
                                    json={"parameters": {"source": str(source)}})
                assert status == 200, body
            if prewarmed:
                status, said = order(d, "started")
                assert status == 200 and float(said.removeprefix("ok: ")) < asked, "the hostile model's runner is not the spare"
            index = {row["name"]: row for row in call(d, "POST", "/v2/repository/index", json={})[1]}
            digests = {name: row["version"] for name, row in index.items()}
            yield mode, d, digests, secret
            assert d.proc.poll() is None, "the daemon died"


def test_every_escape_fails_and_the_neighbour_keeps_answering(node) -> None:
    mode, d, digests, secret = node
    root = d.root
    (root / "index.db").chmod(0o666)   # writable by anyone: only the sandbox keeps the model from it
    victim = root / "models" / digests["victim"]
    own = root / "models" / digests["hostile"]
    escapes = {
        "write its own model file (a hardlink to the store's blob)": "chmod_write:model/weights.bin",
        "write it by its path in the store": f"chmod_write:{own}/model/weights.bin",
        "write the index": f"write:{root}/index.db",
        "read another model": f"read:{victim}/model/main.py",
        "list the store": f"list:{root}/blobs",
        "read a secret of the daemon's settings": f"read:{secret}",
        "open a TCP connection to the daemon": f"tcp:{d.host_port}",
        "connect to the daemon's Unix socket": f"unix:{d.socket_path}",
        "signal the daemon": f"kill:{d.proc.pid}",
        "open the daemon's files (its tensor arena)": f"fds:{d.proc.pid}",
    }
    with Steady(d) as steady:
        for what, attempt in escapes.items():
            status, said = order(d, attempt)
            assert status == 200, (what, said)
            if said.startswith("ok") and attempt.startswith("write:"):
                # Under bubblewrap the store's path may exist in the runner's own tmpfs /tmp (the tests'
                # stores live under /tmp): what counts is that the host's file is untouched.
                assert mode == "bwrap" and (root / "index.db").read_bytes()[-4:] != b"EVIL", said
                continue
            assert said.startswith("denied"), f"{mode}: {what}: {said}"
    assert not (root / "index.db").read_bytes().endswith(b"EVIL")
    assert steady.statuses and set(steady.statuses) == {200}, steady.statuses
    assert d.proc.poll() is None
    (root / "index.db").chmod(0o644)
    verify = subprocess.run([sys.executable, "-m", "cartonstore.cli", "verify", "--root", str(root), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0 and json.loads(verify.stdout)["ok"], verify.stdout + verify.stderr


def runner_statuses(d: DaemonProcess, digests: dict[str, str]) -> dict[int, dict[str, str]]:
    """/proc/PID/status, as fields, of each process of each loaded model's
    runners (bubblewrap's own processes, which run no model code, aside)."""
    from kit.prockit import live_pids

    statuses = {}
    for name in digests:
        for pid in live_pids(runner_marker(d, name, digests)):
            try:
                if os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "bwrap":
                    continue
                statuses[pid] = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text()
                                     .splitlines() if ":\t" in line)
            except OSError:   # gone since it was listed
                continue
    return statuses


def test_no_kernel_object_is_shared_and_the_syscalls_it_needs_not_are_denied(node) -> None:
    """The seccomp filter, the emptied capability sets and a session keyring
    of its own, in every runner (a pre-warmed spare's too): the daemon's key
    is out of reach, a runner can add no key for another to read, make no
    namespace, reach no SysV IPC object of the host's."""
    mode, d, digests, _ = node
    denied = {
        "read a key in the daemon's session keyring": f"keyctl_read:{d.planted_key}",
        "add a key to the keyring every runner of its user shares": "add_key:for-another-runner",
        "make a user namespace": "unshare_user",
        "clone() a child into a user namespace": "clone_user",
        "set up an io_uring": "io_uring",
        **{f"call {name}": f"syscall:{name}" for name in ("bpf", "perf_event_open", "userfaultfd", "setns", "mount",
                                                          "fsopen", "process_vm_readv", "syslog")},
    }
    for what, attempt in denied.items():
        status, said = order(d, attempt)
        assert status == 200 and said.startswith("denied") and "[Errno 1]" in said, f"{mode}: {what}: {said}"
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x63730000 | os.getpid() & 0xFFFF
    segment = libc.shmget(key, 4096, 0o1666)   # IPC_CREAT, for any user: one the host shares
    assert segment >= 0, os.strerror(ctypes.get_errno())
    try:   # Landlock alone: the host's IPC namespace, closed by the filter; bubblewrap: one of its own
        said = order(d, f"shmget:{key}")[1]
        assert said.startswith("denied") and ("[Errno 2]" if mode == "bwrap" else "[Errno 1]") in said, said
    finally:
        libc.shmctl(segment, 0, None)   # IPC_RMID
    said = order(d, "status")[1]
    assert {"Seccomp: 2", "CapBnd: 0000000000000000", "CapAmb: 0000000000000000"} <= set(said.split("; ")), said
    statuses = runner_statuses(d, digests)
    assert len(statuses) >= len(digests), statuses
    for pid, status in statuses.items():
        assert (status["Seccomp"], status["CapBnd"], status["CapAmb"]) == ("2", "0" * 16, "0" * 16), (pid, status)


def test_sockets_are_the_ones_its_sandbox_needs(node) -> None:
    """No raw, packet or non-route netlink socket anywhere; under Landlock
    alone, with no network namespace, nothing but AF_UNIX: no UDP to the
    host, no netlink listing of its interfaces."""
    mode, d, _, _ = node
    denied = {"open an AF_PACKET socket": "socket:17:3:0", "open a raw IP socket": "socket:2:3:1",
              "open a netfilter netlink socket": "socket:16:3:12"}
    if mode == "landlock":
        denied.update({"open a UDP socket": "socket:2:2:0", "bind UDP on 0.0.0.0": "udp_bind",
                       "list the host's interfaces over netlink": "interfaces"})
    for what, attempt in denied.items():
        status, said = order(d, attempt)
        assert status == 200 and said.startswith("denied") and "[Errno 1]" in said, f"{mode}: {what}: {said}"
    if mode == "bwrap":   # a network namespace of its own: route netlink sees its lo, nothing of the host's
        assert order(d, "interfaces")[1] == "ok: interfaces ['lo']"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.setblocking(False)
        status, said = order(d, f"udp:127.0.0.1:{listener.getsockname()[1]}")
        # bubblewrap: sent to its own namespace's 127.0.0.1; Landlock alone: no AF_INET socket at all
        assert said.startswith("ok: sent" if mode == "bwrap" else "denied"), said
        with pytest.raises(BlockingIOError):   # sendto() to loopback has queued it, if it got anywhere
            listener.recvfrom(64)
    # What Landlock alone cannot stop (the runners page's table says so): connect() to a Unix socket by its path
    # where the socket's mode lets any user in. Under bubblewrap it is not in the runner's mount namespace.
    with tempfile.TemporaryDirectory(prefix="cs-any-user-") as where, socket.socket(socket.AF_UNIX) as service:
        os.chmod(where, 0o755)
        service.bind(f"{where}/service.sock")
        os.chmod(f"{where}/service.sock", 0o777)
        service.listen()
        said = order(d, f"unix:{where}/service.sock")[1]
        assert said.startswith("ok" if mode == "landlock" else "denied"), said


def test_each_runner_maps_its_own_models_arena_and_no_other(node) -> None:
    """One tensor arena per model: the sandboxed runner is handed its own
    (a big binary request goes through it), and cannot reach another
    runner's (its /proc/PID/fd: another PID namespace, or another Landlock
    domain)."""
    from kit.prockit import live_pids

    mode, d, digests, _ = node
    status, said = order(d, "memfds")
    assert status == 200 and said == "ok: memfds ['/memfd:cartonstore-arena (deleted)']", said
    victims = live_pids(runner_marker(d, "victim", digests))
    assert victims
    for pid in victims:
        status, said = order(d, f"fds:{pid}")
        assert said.startswith("denied"), f"{mode}: another runner's fds: {said}"
    before = arena_requests(d)
    x = np.arange(1 << 17, dtype=np.float32).reshape(1, -1)   # 512 KiB: big enough for the arena
    header = json.dumps({"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": list(x.shape),
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "y_float32", "parameters": {"binary_data": False}}]}).encode()
    status, body = call(d, "POST", "/v2/models/echo/infer", data=header + x.tobytes(),
                        headers={"Inference-Header-Content-Length": str(len(header)),
                                 "Content-Type": "application/octet-stream"})
    assert status == 200 and body["outputs"][0]["data"][:3] == [0.0, 1.0, 2.0]
    assert arena_requests(d) == before + 1


def arena_requests(d: DaemonProcess) -> float:
    text = call(d, "GET", "/metrics")[1]
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("cartonstore_arena_requests_total "))


def test_system_shared_memory_reaches_a_sandboxed_runner_as_fds(node) -> None:
    """Triton's system shared memory through a sandboxed runner: it sees no
    /dev/shm, so the daemon hands it each region's fd; inputs are read from
    the client's object and outputs written into it."""
    mode, d, _, _ = node
    x = np.arange(4, dtype=np.float32) + 0.5
    keys = {"in": f"/cs-sbx-in-{mode}-{os.getpid()}", "out": f"/cs-sbx-out-{mode}-{os.getpid()}"}
    paths = {k: Path("/dev/shm") / v[1:] for k, v in keys.items()}
    try:
        paths["in"].write_bytes(x.tobytes())
        paths["out"].write_bytes(bytes(x.nbytes))
        for name, key in keys.items():
            status, body = call(d, "POST", f"/v2/systemsharedmemory/region/{name}-{mode}/register",
                                json={"key": key, "offset": 0, "byte_size": x.nbytes})
            assert status == 200, body
        status, body = call(d, "POST", "/v2/models/echo/infer", json={
            "inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 4],
                        "parameters": {"shared_memory_region": f"in-{mode}", "shared_memory_byte_size": x.nbytes}}],
            "outputs": [{"name": "y_float32", "parameters": {"shared_memory_region": f"out-{mode}",
                                                              "shared_memory_byte_size": x.nbytes}}]})
        assert status == 200, body
        assert np.array_equal(np.frombuffer(paths["out"].read_bytes(), dtype=np.float32), x)
    finally:
        for name in keys:
            call(d, "POST", f"/v2/systemsharedmemory/region/{name}-{mode}/unregister")
        for path in paths.values():
            path.unlink(missing_ok=True)


def test_a_fork_bomb_stops_at_max_processes(node) -> None:
    _mode, d, _, _ = node
    with Steady(d) as steady:
        status, said = order(d, "fork:2000")
    assert status == 200 and said.startswith("denied") and "failed after" in said, said
    born = int(said.split("failed after ")[1].split(":")[0])
    assert born < 512, said
    assert set(steady.statuses) == {200}
    assert order(d, "list:.")[1].startswith("ok")   # the bomber itself still serves


def test_a_model_over_its_memory_limit_fails_alone(node) -> None:
    _mode, d, _, _ = node
    with Steady(d) as steady:
        status, said = order(d, "mem:6")   # 6 GiB at most, whatever happens: the limit is 1 GiB
        assert status != 200 or said.startswith("denied"), said
        # Killed by the OOM killer (cgroup) or refused (rlimit): either way it serves again.
        assert wait_for(lambda: order(d, "list:.")[0] == 200, timeout=60, interval=0.5)
    assert set(steady.statuses) == {200}
    assert d.proc.poll() is None


def test_the_index_and_metrics_say_which_layers_hold(node) -> None:
    mode, d, _, _ = node
    rows = {row["name"]: row for row in call(d, "POST", "/v2/repository/index", json={})[1]}
    layers = rows["hostile"]["sandbox"].split("+")
    assert layers[0] == mode and "uid" in layers, layers
    assert {"caps:none", "seccomp", "keyring"} <= set(layers), layers
    started = next(line for line in d.log_file.read_text().splitlines() if "runners run sandboxed: " in line)
    assert started.endswith("no capabilities, a seccomp filter, a session keyring each"), started
    if mode == "bwrap":
        assert "landlock" in layers
    _status, text = call(d, "GET", "/metrics")
    assert f'cartonstore_runner_sandbox{{layers="{rows["hostile"]["sandbox"]}",model="hostile"' in text


def test_an_unloaded_runner_leaves_no_process_tmp_or_cgroup(node) -> None:
    """Last of the module's tests: it unloads the hostile model. A child it
    put in a session of its own (out of killpg's reach) dies with its cgroup,
    and the tmp it filled with a private directory is removed (as the runner
    user: the daemon's root may hold no CAP_DAC_OVERRIDE)."""
    from kit.prockit import live_pids

    mode, d, digests, _ = node
    hostile = runner_marker(d, "hostile", digests)
    assert order(d, "stash")[1].startswith("ok"), order(d, "stash")
    # The fork bomb's children (5 s sleepers) may still hold the cgroup's pids: fork again once they went.
    assert wait_for(lambda: order(d, "escape")[1] == "ok: escaped", timeout=40, interval=1.0)
    assert wait_for(lambda: len(live_pids(hostile)) >= 2, timeout=10)
    # this daemon's, named for the runner's label: the model's, or the spare's it took
    # (a slot is <owner token>-<label>-<random>)
    label = os.path.basename(hostile).split("-", 1)[1].rsplit("-", 1)[0] + "-" if "/run/slots/" in hostile \
        else "hostile"
    tmps = list(Path("/tmp").glob(f"cartonstore-runner-{d.proc.pid}-{label}*"))
    assert (mode == "landlock") == bool(tmps), tmps   # bubblewrap's /tmp is a tmpfs of its own
    # the runner's own cgroups (named for its label: a spare's, when it took one), as its /proc says
    running = {Path("/sys/fs/cgroup", controllers.split(",")[0] if controllers else "", path.lstrip("/"))
               for pid in live_pids(hostile)
               for _, controllers, path in (line.split(":", 2) for line in
                                            Path(f"/proc/{pid}/cgroup").read_text().splitlines())
               if f"/cartonstore-{d.proc.pid}-" in path}
    rows = {row["name"]: row for row in call(d, "POST", "/v2/repository/index", json={})[1]}
    if "cgroup" in rows["hostile"]["sandbox"]:   # the index says a cgroup holds it: it must be found
        assert running, "the runner is in no cgroup of its own"
    assert call(d, "POST", "/v2/repository/models/hostile/unload", json={})[0] == 200
    assert wait_for(lambda: not live_pids(hostile), timeout=15), live_pids(hostile)
    assert wait_for(lambda: not any(p.exists() for p in tmps), timeout=15), tmps
    assert wait_for(lambda: not any(c.exists() for c in running), timeout=15), running
    assert wait_for(lambda: not [c for base in ("pids", "memory") for c in Path(f"/sys/fs/cgroup/{base}").glob(
        f"cartonstore-{d.proc.pid}-hostile*")], timeout=15)


@pytest.mark.parametrize("mode", ["bwrap", "landlock"])
def test_sandboxed_runners_die_with_a_killed_daemon(mode: str) -> None:
    """SIGKILL the daemon: nothing it sandboxed outlives it (bwrap, setpriv
    and the runner under it; or the runner after its change of user, which
    clears the parent-death signal the daemon armed: confine arms it again)."""
    from conftest import short_dir
    from kit.prockit import live_pids

    if (why := why_not(mode)) is not None:
        pytest.skip(why)
    with short_dir() as base:
        base.chmod(0o711)
        config = base / "cartonstore.toml"
        config.write_text(f'[runners]\nsandbox = "{mode}"\nuser = "{runner_user().pw_name}"\n')
        d = DaemonProcess(base / "root", extra_args=["--config", str(config)], env={"CARTONSTORE_SANDBOX": mode},
                          log_file=base / "daemon.log")
        with d:
            source = echo_carton(base / "echo", dtypes=["float32"])
            assert call(d, "POST", "/v2/repository/models/echo/load",
                        json={"parameters": {"source": str(source)}})[0] == 200
            runners = f"{base / 'root' / 'run'}/"   # in the command lines of runners (sockets, slots), not the daemon's
            assert live_pids(runners), "no runner process found"
            d.proc.kill()
            d.proc.wait(10)
            assert wait_for(lambda: not live_pids(runners), timeout=10), live_pids(runners)
