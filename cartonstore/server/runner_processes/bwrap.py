"""Bubblewrap's part of a runner's sandbox (sandbox.py): its command line,
the view of the filesystem it mounts, and whether it runs here.

For a root daemon a first launcher (system/confine.py) enters a user
namespace mapping only root and the runner's uid, where bubblewrap runs as
root: it binds what the runner reads with root's rights, so a Python or a
store under /root (0700) is no obstacle, and the launcher inside drops to
the runner's uid with no capability left. For a daemon that is not root,
bubblewrap makes the user namespace itself, as that user.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

from cartonstore.system.syscalls import CAP_SETFCAP, in_bounding_set

# Bubblewrap as root in the runner's user namespace (the root flavour): the namespaces but a user one, and
# of root's capabilities only those the launcher inside needs to drop to the runner's uid and empty its sets.
ROOT_UNSHARE = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP")


@functools.lru_cache(maxsize=16)
def _refusal(bwrap: str, identity: tuple[int, int] | None, sized: bool) -> str | None:
    """None when bubblewrap runs here as runners get it (with --size where
    ``sized``), else why not: its last line on stderr."""
    # A tmpfs on /dev/shm, not /tmp: this Python may live under /tmp.
    tail = [*(["--size", str(1 << 20)] if sized else []), "--perms", "01777", "--tmpfs", "/dev/shm"]
    try:
        done = subprocess.run(bwrap_command(bwrap, identity, ["--ro-bind", "/", "/", *tail], {}, ["true"]),
                              check=False, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else f"exit status {done.returncode}"


def bwrap_support(bwrap: str, identity: tuple[int, int] | None) -> tuple[bool, bool]:
    """(whether bubblewrap can make its namespaces here, the way runners get
    them: as the daemon's user, or for a root daemon as root of a user
    namespace holding the runner's uid (a container may forbid either);
    whether it takes --size, which bubblewrap before 0.8 does not)."""
    if _refusal(bwrap, identity, True) is None:
        return True, True
    return _refusal(bwrap, identity, False) is None, False


def bwrap_refusal(bwrap: str, identity: tuple[int, int] | None) -> str | None:
    """Why bubblewrap cannot run here as runners get it, in words (None when
    it can): what it said, and for a root daemon without CAP_SETFCAP, that
    the kernel (5.12+) wants it to map root in the runners' user namespace."""
    why = _refusal(bwrap, identity, False)
    if why is None or identity is None or in_bounding_set(CAP_SETFCAP):
        return why
    return (f"{why}; a root daemon maps root in its runners' user namespace, which needs CAP_SETFCAP in its "
            f"capability bounding set (systemd: CapabilityBoundingSet=... CAP_SETFCAP)")


def launcher(plan: dict) -> list[str]:
    """The command line of system/confine.py applying ``plan``, ended by "--"."""
    return [sys.executable, "-I", "-m", "cartonstore.system.confine", json.dumps(plan), "--"]


def bwrap_command(bwrap: str, identity: tuple[int, int] | None, view: list[str], plan: dict,
                  program: list[str]) -> list[str]:
    """The runner's whole command line under bubblewrap: ``view`` (its
    mounts), the launcher applying ``plan`` inside, then ``program``. For a
    root daemon a launcher before bubblewrap enters the user namespace of
    root and the runner's uid, and the one inside drops to that uid."""
    if identity is None:
        return [bwrap, "--die-with-parent", "--unshare-all", "--cap-drop", "ALL", *view, "--",
                *launcher(plan), *program]
    uid, gid = identity
    # The runner is pid 2 of bubblewrap's PID namespace, under its init: the drop of uid clears the
    # parent-death signal bubblewrap armed, so the launcher arms it again for pid 1.
    inner = {**plan, "drop_caps": True, "user": [uid, gid], "parent": 1}
    return [*launcher({"userns": {"uid": [0, uid], "gid": [0, gid]}, "parent": os.getpid()}),
            bwrap, "--die-with-parent", *ROOT_UNSHARE, *view, "--", *launcher(inner), *program]


def bwrap_view(reads: tuple[str, ...], model_dir: Path, gpus: tuple[str, ...], networked: bool,
               sizes: tuple[int, int] | None) -> list[str]:
    """Bubblewrap's mounts: what the runner reads, each bound read-only
    where it is on the host, under directories made 0755 (not the host's
    modes: a /root of 0700 stays out of the way of what is bound below it);
    a private /tmp and /dev/shm, of ``sizes`` (bubblewrap 0.8+ takes them)."""
    args = ["--share-net"] if networked else []
    tmp_size = ["--size", str(sizes[0])] if sizes else []
    shm_size = ["--size", str(sizes[1])] if sizes else []
    # /tmp first: what is bound below it afterwards (a virtualenv, a store under /tmp) stays visible.
    args += ["--dev", "/dev", "--perms", "01777", *shm_size, "--tmpfs", "/dev/shm", "--proc", "/proc",
             "--perms", "01777", *tmp_size, "--tmpfs", "/tmp"]
    made: set[str] = {"/", "/dev", "/proc", "/tmp"}
    bound: list[str] = []

    def bind(source: str, dest: str, how: str = "--ro-bind") -> None:
        for parent in reversed(Path(dest).parents):
            p = str(parent)
            if p not in made and not any(p == b or p.startswith(b + "/") for b in bound):
                args.extend(["--perms", "0755", "--dir", p])
                made.add(p)
        args.extend([how, source, dest])
        bound.append(dest)

    for path in dict.fromkeys(reads):
        if os.path.islink(path) and path.count("/") == 1:   # merged /usr: /bin -> usr/bin
            args.extend(["--symlink", os.readlink(path), path])
            made.add(path)
        elif os.path.exists(path):
            bind(os.path.realpath(path), path)
    bind("/sys/devices/system/cpu", "/sys/devices/system/cpu", "--ro-bind-try")
    for device in gpus:
        args += ["--dev-bind", device, device]
    bind(str(model_dir), str(model_dir))
    return [*args, "--chdir", str(model_dir)]
