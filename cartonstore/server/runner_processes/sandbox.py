"""The sandbox every runner runs in: a carton's code is hostile.

A runner may read its own model directory, the Python it runs and the
system libraries (read-only); write a private /tmp; serve the one socket it
is handed (bound by the daemon, passed as LISTEN_FDS: the run directory is
never its to see). It may not write anything else, read the store, the
index, other models, the settings or their secrets, open TCP connections
(unless [runners.network] allows that model), see or signal the daemon or
other runners, or run as root. Layers, each where the host has it:

- bwrap (bubblewrap, what Flatpak runs on): a mount namespace holding only
  what it may read, bound in one by one (its Python's prefixes and site
  directories, its model directory: the socket comes as an fd), new PID,
  IPC, UTS and network namespaces, a tmpfs /tmp and a private /dev/shm
  (POSIX semaphores, joblib), each sized, their pages counted in its
  memory cgroup;
- landlock (system/landlock.py): the same file rules in the kernel, no TCP,
  no signals or abstract sockets out of the domain: the only layer when
  bubblewrap is missing, a second one inside it otherwise;
- uid: when the daemon is root, the launcher (system/confine.py) drops to
  ``runners.user``, or where the default user does not exist (or user = "")
  to a transient uid of this daemon's own (system/transient_uid.py). Under
  bubblewrap (bwrap.py) that launcher runs inside, after bubblewrap bound
  what the runner reads with root's rights (a Python or store under /root,
  0700, included);
- cgroup / rlimits: ``max_processes`` and ``memory_limit``;
- caps:none: the bounding and ambient capability sets emptied;
- seccomp (system/seccomp.py): no keyrings, namespaces, io_uring, bpf,
  ptrace, mounts; sockets of the families the mode needs: AF_UNIX,
  AF_INET* (under bubblewrap, whose network namespace holds only lo, or for
  a model [runners.network] allows) and route-only netlink (bubblewrap);
  SysV IPC and message queues only in bubblewrap's IPC namespace;
- keyring: a session keyring of its own, not the daemon's.

``confine`` plans one instance: its whole command line, its environment
(an allow-list), and what holds, in words, for the index and the log
("bwrap+landlock+uid+cgroup:pids+caps:none+seccomp+keyring"; a layer the
kernel cannot give is named "no-seccomp", "no-keyring"). Where no mechanism
is found it raises InvalidInput saying how to get one, unless
runners.sandbox = "none".
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from cartonstore.errors import InvalidInput
from cartonstore.runner.protocol import FD_ENVS
from cartonstore.system import transient_uid
from cartonstore.system.cgroups import RunnerCgroup
from cartonstore.system.cgroups import create as create_cgroup
from cartonstore.system.keyring import unavailable as keyrings_unavailable
from cartonstore.system.landlock import abi_version
from cartonstore.system.seccomp import unavailable as seccomp_unavailable
from cartonstore.system.syscalls import CAP_SETPCAP, in_bounding_set

from .bwrap import bwrap_command, bwrap_refusal, bwrap_support, bwrap_view, launcher
from .reads import python_paths, unreachable

SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt/conda")
ETC_READ = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/nsswitch.conf",
            "/etc/passwd", "/etc/group", "/etc/hosts", "/etc/host.conf", "/etc/mime.types", "/etc/ssl/certs",
            "/etc/ca-certificates", "/etc/os-release", "/etc/alternatives")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
CPU_INFO = ("/sys/devices/system/cpu", "/sys/fs/cgroup", "/proc/cpuinfo", "/proc/meminfo", "/proc/self")
ENV_KEEP = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")
PATH = "/usr/local/bin:/usr/bin:/bin"
CGROUP_PREFIX = "cartonstore-"   # runner cgroups: cartonstore-<daemon pid>-<instance>
DEFAULT_USER = "cartonstore-runner"   # where it does not exist, a root daemon's runners get a transient uid
TRANSIENT = ""                        # runners.user = "": a transient uid even where the default user exists
HOW_TO = ('install bubblewrap (Debian: apt-get install bubblewrap) or run on a kernel with Landlock (5.13+, '
          'lsm=landlock); or set [runners] sandbox = "none" to run model code with the daemon\'s own rights')


@dataclass(frozen=True)
class SandboxPolicy:
    """What the daemon asks of every runner ([runners] settings)."""

    mode: str = "auto"                    # auto | bwrap | landlock | none
    user: str = DEFAULT_USER              # runs as this user when the daemon is root ("": a transient uid)
    memory_limit: int | None = None
    max_processes: int = 512
    read_paths: tuple[str, ...] = ()      # sandbox_paths: more it may read
    network: frozenset[str] = frozenset()  # models whose runners keep the network
    tmp_size: int = 256 << 20
    # where a transient uid is held beside the host's /run: the store's locks/, shared with daemons in
    # other containers whose /run is their own
    uid_locks: tuple[Path, ...] = ()

    @property
    def shm_size(self) -> int:
        """Its /dev/shm's size: its memory limit (which counts the pages
        anyway), or as much as /tmp gets."""
        return self.memory_limit or self.tmp_size


@dataclass
class Confinement:
    argv: list[str]
    env: dict[str, str]
    layers: tuple[str, ...]
    cgroup: RunnerCgroup | None = None
    tmp: Path | None = None     # a private tmp directory on the host (Landlock alone)
    owner: tuple[int, int] | None = None   # the runner user, who owns what it wrote in tmp
    released: bool = field(default=False, repr=False)

    @property
    def description(self) -> str:
        return "+".join(self.layers)

    def release(self) -> None:
        """After the runner's processes ended: its cgroup and private tmp."""
        if self.released:
            return
        self.released = True
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.tmp is not None:
            _remove_as(self.tmp, self.owner)


def _remove_as(tmp: Path, owner: tuple[int, int] | None) -> None:
    """Remove a runner's private tmp as the user who wrote it: the daemon's
    root holds no CAP_DAC_OVERRIDE under its unit, so it could not enter
    the runner's own 0700 directories. In a thread: it may be big."""
    if owner is None:
        shutil.rmtree(tmp, ignore_errors=True)
        return

    def run() -> None:
        try:
            subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)], user=owner[0], group=owner[1],
                           extra_groups=[], capture_output=True, timeout=600)
        except (OSError, subprocess.SubprocessError):
            pass
        shutil.rmtree(tmp, ignore_errors=True)   # the directory itself sits in /tmp, the daemon's
    threading.Thread(target=run, name="cartonstore-tmp-rm", daemon=True).start()


def mechanisms(policy: SandboxPolicy, identity: tuple[int, int] | None) -> tuple[str | None, bool, int]:
    """(bubblewrap's path, or None where it is not to be used; whether it
    takes --size; the Landlock ABI), or InvalidInput saying what is missing."""
    bwrap = shutil.which("bwrap")
    works, sized = bwrap_support(bwrap, identity) if bwrap and policy.mode in ("auto", "bwrap") \
        else (False, False)
    abi = abi_version()
    if policy.mode == "bwrap" and not works:
        why = f"{bwrap_refusal(bwrap, identity)}. " if bwrap else ""
        raise InvalidInput(f"runners.sandbox = \"bwrap\", but bubblewrap cannot run here: {why}{HOW_TO}")
    if works:
        return bwrap, sized, abi
    # Landlock alone stops no chmod, no connect() to a Unix socket by path and no UDP: it holds only for a
    # runner of another uid than the daemon's (whose files and socket that uid may not touch), and only
    # from ABI 6, which scopes signals (before it a runner may kill the daemon).
    if abi < 1:
        raise InvalidInput(f"no sandbox for model runners here: {HOW_TO}")
    if identity is None:
        raise InvalidInput("only Landlock is here, and alone it cannot keep a runner that runs as the daemon's own "
                           "user from the daemon's socket and files: install bubblewrap (and allow unprivileged "
                           "user namespaces), run the daemon as root with runners.user, or set [runners] "
                           "sandbox = \"none\"")
    if abi < 6:
        raise InvalidInput(f"only Landlock ABI {abi} is here (Linux before 6.12): it cannot stop a runner from "
                           f"signalling the daemon. {HOW_TO}")
    if not in_bounding_set(CAP_SETPCAP):   # bubblewrap's user namespace gives it; the host's does not
        raise InvalidInput("under Landlock alone a root daemon empties each runner's capability bounding set, "
                           "which needs CAP_SETPCAP in its own, and it has none (systemd: "
                           "CapabilityBoundingSet=... CAP_SETPCAP); or let bubblewrap run (CAP_SETFCAP)")
    return None, False, abi


@dataclass(frozen=True)
class Host:
    """What this host offers runners (``prerequisites``)."""

    identity: tuple[int, int] | None   # (uid, gid) runners drop to; None: the daemon's own (not root)
    bwrap: str | None                  # bubblewrap, where it is used
    sized: bool                        # it takes --size
    abi: int                           # Landlock ABI (0: none)
    no_seccomp: str | None = None      # why runners get no seccomp filter here; None: they do
    no_keyring: str | None = None      # why runners get no session keyring of their own; None: they do
    unreachable: tuple[str, ...] = ()  # Landlock alone: what the runner's uid cannot reach, one line each
    no_bwrap: str | None = None        # why bubblewrap, installed, cannot run here; None: it runs or is absent

    @property
    def transient(self) -> bool:
        return self.identity is not None and self.identity == transient_uid.held()

    @property
    def uid_layer(self) -> str:
        """The uid layer's name: "uid", or "uid:transient(N)"."""
        return f"uid:transient({self.identity[0]})" if self.transient else "uid"  # type: ignore[index]  # transient: set

    def describe(self, policy: SandboxPolicy) -> str:
        if not self.bwrap:
            said = f"Landlock ABI {self.abi} alone (NO /dev/shm: no mount namespace to give each runner its own)"
            if self.no_bwrap:
                said += f" (bubblewrap is installed but cannot run here: {self.no_bwrap})"
        else:
            said = "bubblewrap" + (f" with Landlock ABI {self.abi}" if self.abi else "")
            said += f" and a private /dev/shm of {_mib(policy.shm_size)} each" if self.sized \
                else " and a private /dev/shm each (unsized: bubblewrap before 0.8 takes no --size)"
        if self.transient:
            why = "runners.user = \"\"" if policy.user == TRANSIENT else f"no user {policy.user!r} here"
            said += f", as transient uid {self.identity[0]} ({why})"  # type: ignore[index]  # transient: set
        elif self.identity is not None:
            said += f", as {policy.user}"
        said += ", no capabilities"
        said += f", NO seccomp filter ({self.no_seccomp})" if self.no_seccomp else ", a seccomp filter"
        return said + (f", NO keyring of their own ({self.no_keyring})" if self.no_keyring
                       else ", a session keyring each")


def _mib(size: int) -> str:
    return f"{size / (1 << 30):g} GiB" if size >= 1 << 30 else f"{size / (1 << 20):g} MiB"


def prerequisites(policy: SandboxPolicy, store: tuple[Path, ...] = ()) -> Host:
    """The mechanisms runners get here, or InvalidInput saying what is
    missing: a runner user that exists (or a transient uid) and is not root;
    bubblewrap, or Landlock under the rules of mechanisms() with a seccomp
    filter. Under Landlock alone, what the runner's uid cannot pass down to
    (its Python; ``store``, the directories of the store its models are
    read from) is in Host.unreachable: bubblewrap binds them as root."""
    identity = runner_identity(policy)
    bwrap, sized, abi = mechanisms(policy, identity)
    no_seccomp = seccomp_unavailable()
    if bwrap is None and no_seccomp:
        # Without a network namespace, only the filter keeps a runner from UDP to the host and its interfaces.
        raise InvalidInput(f"only Landlock is here, and with no seccomp filter ({no_seccomp}) it cannot keep a "
                           f"runner from sending UDP to the host or listing its interfaces: install bubblewrap "
                           f"(Debian: apt-get install bubblewrap), or set [runners] sandbox = \"none\" to run "
                           f"model code with the daemon's own rights")
    lines: tuple[str, ...] = ()
    if identity is not None and bwrap is None:
        lines = tuple(line for line in (_unreachable_line(policy, "its Python", (sys.executable, *python_paths()),
                                                          identity),
                                        _unreachable_line(policy, "the store's models", store, identity))
                      if line is not None)
    installed = shutil.which("bwrap") if bwrap is None and policy.mode == "auto" else None
    return Host(identity, bwrap, sized, abi, no_seccomp, keyrings_unavailable(), lines,
                bwrap_refusal(installed, identity) if installed else None)


def _unreachable_line(policy: SandboxPolicy, what: str, paths: tuple[str | Path, ...],
                      identity: tuple[int, int]) -> str | None:
    """One line naming the first of ``paths`` the runner's uid cannot pass
    down to, and the directory that stops it; None when it reaches them all."""
    for path in paths:   # as named (how a runner is started: a venv's bin/python) and where it leads
        candidates = dict.fromkeys((os.path.abspath(path), os.path.realpath(path)))
        if (blocked := next(filter(None, (unreachable(c, *identity) for c in candidates)), None)) is not None:
            who = f"runners.user {policy.user!r}" if transient_uid.held() != identity \
                else f"the runners' transient uid {identity[0]}"
            return (f"under Landlock alone (no mount namespace to bind it in), {who} cannot reach {what}, "
                    f"{path}: {blocked}. Under bubblewrap (runners.sandbox = \"auto\" or \"bwrap\", where it can run) "
                    f"it is bound in; or put it where that uid may pass (0755 parents)")
    return None


def runner_identity(policy: SandboxPolicy) -> tuple[int, int] | None:
    """(uid, gid) runners drop to, None when the daemon is not root (they
    keep its uid, confined): runners.user's, or a transient pair of this
    daemon's own where that is "" or the default user, which does not
    exist. InvalidInput when a user named otherwise is missing."""
    if os.geteuid() != 0:
        return None
    entry = None
    if policy.user != TRANSIENT:
        try:
            entry = pwd.getpwuid(int(policy.user)) if policy.user.isdigit() else pwd.getpwnam(policy.user)
        except (KeyError, ValueError):
            if policy.user != DEFAULT_USER:
                raise InvalidInput(f"runners.user {policy.user!r} does not exist: the daemon runs as root and runs "
                                   f"model code as that user, never as root. Create it (useradd --system "
                                   f"--no-create-home --shell /usr/sbin/nologin {policy.user}), or leave runners.user "
                                   f"unset for a transient uid", subject="runners.user") from None
    if entry is None:
        try:
            return transient_uid.take((transient_uid.LOCK_DIR, *policy.uid_locks))
        except OSError as e:
            raise InvalidInput(f"runners.user: no transient uid for runners: {e}", subject="runners.user") from None
    if entry.pw_uid == 0:
        raise InvalidInput(f"runners.user {policy.user!r} is root: runners never run as root",
                           subject="runners.user")
    return entry.pw_uid, entry.pw_gid


def _isolated(argv: list[str]) -> list[str]:
    """``python -m x`` made ``python -I -m x``: no environment, no user site,
    not the working directory on sys.path."""
    if len(argv) > 1 and os.path.realpath(argv[0]) == os.path.realpath(sys.executable) and argv[1] != "-I":
        return [argv[0], "-I", *argv[1:]]
    return list(argv)


def _gpu_devices(device: str) -> tuple[str, ...]:
    if not device.startswith("cuda"):
        return ()
    try:
        names = os.listdir("/dev")
    except OSError:
        return ()
    found = [f"/dev/{n}" for n in names if n.startswith("nvidia")]
    caps = "/dev/nvidia-caps"
    if os.path.isdir(caps):
        found += [f"{caps}/{n}" for n in os.listdir(caps)]
    return tuple(sorted(found))


def confine(policy: SandboxPolicy, argv: list[str], *, model_dir: Path, model: str, device: str, listen_fd: int,
            env: dict[str, str], label: str, extra_env: dict[str, str] | None = None) -> Confinement:
    """The sandboxed command line and environment of one runner instance;
    ``extra_env``: what the operator's [runners.<name>] env sets."""
    host = prerequisites(policy)
    identity, bwrap, abi = host.identity, host.bwrap, host.abi
    has_bwrap = bwrap is not None
    if identity is not None and not has_bwrap:   # Landlock alone: the runner's uid reads by path
        for what, path in (("its Python", sys.executable), ("its model directory", model_dir)):
            if (line := _unreachable_line(policy, what, (path,), identity)) is not None:
                raise InvalidInput(line, subject="runners.user")
    networked = model in policy.network
    reads = (*python_paths(), *SYSTEM_READ, *ETC_READ, *policy.read_paths,
             *(("/etc/resolv.conf",) if networked else ()))
    if os.path.isabs(argv[0]):
        reads += (os.path.dirname(os.path.realpath(argv[0])),)
    gpus = _gpu_devices(device)
    cgroup = create_cgroup(f"{CGROUP_PREFIX}{os.getpid()}-{label}", max_processes=policy.max_processes or None,
                           memory_limit=policy.memory_limit) if identity is not None else None
    rlimits = {}
    # RLIMIT_NPROC counts every task of a uid: only a runner user's is the runners' own.
    if policy.max_processes and identity is not None and not (cgroup and "cgroup:pids" in cgroup.layers):
        rlimits["NPROC"] = policy.max_processes
    if policy.memory_limit and not (cgroup and "cgroup:memory" in cgroup.layers):
        rlimits["DATA"] = policy.memory_limit
    tmp = None
    if not has_bwrap:   # Landlock alone: a runner of another uid (mechanisms), given a private tmp of its own
        tmp = Path(tempfile.mkdtemp(prefix=f"cartonstore-runner-{os.getpid()}-{label[:40]}-"))
        os.chown(tmp, *identity)  # type: ignore[misc]  # Landlock alone: another uid (mechanisms)
    tmp_inside = "/tmp" if has_bwrap else str(tmp)
    landlock = None if abi < 1 else {
        "read": [*reads, str(model_dir), *CPU_INFO], "write": [tmp_inside, *(("/dev/shm",) if has_bwrap else ())],
        "devices": [*DEVICES, *gpus], "deny_tcp": not networked, "scope": True,
        # what must hold, or the runner does not start (alone, Landlock must hold it all)
        "require": ["fs"] + (["tcp"] if abi >= 4 and not networked else []) + (["signals"] if abi >= 6 else [])}
    # No network or IPC namespace under Landlock alone: sockets beyond AF_UNIX only for a model given the
    # network, and no SysV IPC or message queues (the host's and every runner's).
    sockets = {"inet": has_bwrap or networked, "netlink_route": has_bwrap, "ipc": has_bwrap}
    plan = {"rlimits": rlimits, "drop_caps": True, "listen_fd": listen_fd,
            "fd_env": list(FD_ENVS), "chdir": str(model_dir),
            "keyring": host.no_keyring is None, "landlock": landlock,
            "seccomp": None if host.no_seccomp else sockets}
    layers = []
    if has_bwrap:
        layers.append("bwrap")
        sizes = (policy.tmp_size, policy.shm_size) if host.sized else None
        view = bwrap_view(reads, model_dir, gpus, networked, sizes)
        command = bwrap_command(bwrap, identity, view, plan, _isolated(argv))  # type: ignore[arg-type]  # has_bwrap
    else:   # the launcher drops to the runner user itself, which clears the parent-death signal
        plan.update(user=list(identity), parent=os.getpid())  # type: ignore[arg-type]  # another uid (mechanisms)
        command = [*launcher(plan), *_isolated(argv)]
    if landlock is not None:
        layers.append("landlock")
    if identity is not None:
        layers.append(host.uid_layer)
    if cgroup is not None:
        layers += list(cgroup.layers)
    if rlimits:
        layers.append("rlimits")
    layers += ["caps:none", "no-seccomp" if host.no_seccomp else "seccomp",
               "no-keyring" if host.no_keyring else "keyring"]
    out_env = {k: env[k] for k in ENV_KEEP if k in env}
    out_env.update(PATH=PATH, HOME=tmp_inside, TMPDIR=tmp_inside,
                   CUDA_VISIBLE_DEVICES=env.get("CUDA_VISIBLE_DEVICES", ""))
    out_env.update(extra_env or {})
    return Confinement(command, out_env, tuple(layers), cgroup, tmp, owner=identity)
