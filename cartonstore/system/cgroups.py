"""A cgroup per runner, where this process may make one: limits on its
processes (pids.max) and memory (memory.max, or v1's memory.limit_in_bytes)
that hold for everything it starts, and a process over its memory limit is
the one the kernel's OOM killer ends.

cgroup v2: a child of this process's own cgroup, which the daemon may write
when systemd delegated it (Delegate=yes) or when it runs as root; the pids
and memory controllers must be enabled for children
(cgroup.subtree_control). cgroup v1 (hybrid hosts): a child in the pids and
memory hierarchies, each where writable. Nothing found: ``create`` returns
None and the caller falls back to rlimits.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
log = logging.getLogger("cartonstore.server.runner_processes")


@dataclass(frozen=True)
class RunnerCgroup:
    dirs: tuple[Path, ...]     # one directory (v2) or one per v1 hierarchy
    layers: tuple[str, ...]    # what it limits: "cgroup:pids", "cgroup:memory"

    @property
    def memory_dir(self) -> Path | None:
        """The directory that accounts its memory (v2: its one; v1: the
        memory hierarchy's), None when it limits no memory."""
        if "cgroup:memory" not in self.layers:
            return None
        return self.dirs[0] if len(self.dirs) == 1 else self.dirs[self.layers.index("cgroup:memory")]

    def attach_self(self) -> None:
        """Move the calling process (a runner between fork and exec) in."""
        pid = str(os.getpid()).encode()
        for d in self.dirs:
            fd = os.open(d / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def remove(self) -> None:
        """After the runner's end: what is still in it (a process that left
        the runner's process group with setsid, out of killpg's reach) is
        killed, then the cgroup goes; retried in a thread while the dead
        are reaped."""
        for d in self.dirs:
            if not _rmdir(d):
                threading.Thread(target=_kill_and_remove, args=(d,), name="cartonstore-cgroup", daemon=True).start()


def _own_v2_dir() -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            path = ROOT / line[3:].lstrip("/")
            return path if (path / "cgroup.controllers").is_file() else None
    return None


def _v1_dir(controller: str) -> Path | None:
    base = ROOT / controller
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                here = base / path.lstrip("/")
                return here if here.is_dir() else base
    except (OSError, ValueError):
        return None
    return None


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


LEAF = "daemon"


def take_delegation() -> bool:
    """cgroup v2 lets a cgroup give controllers to children only while no
    process sits in it: a daemon alone in the cgroup systemd delegated to
    it (Delegate=, a *.service) moves into a leaf child and enables pids and
    memory for its siblings, the runners' cgroups. Nothing is moved where
    any other process shares the cgroup. Whether it did."""
    v2 = _own_v2_dir()
    if v2 is None or not v2.name.endswith(".service"):
        return False
    try:
        if (v2 / "cgroup.procs").read_text().split() != [str(os.getpid())]:
            return False
        wanted = {"pids", "memory"} & set((v2 / "cgroup.controllers").read_text().split())
        leaf = v2 / LEAF
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        (v2 / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted)))
        return True
    except OSError as e:
        log.info("runner cgroups: cannot take the delegated cgroup %s (%s); limits fall back to rlimits", v2, e)
        return False


def _runners_base() -> Path | None:
    """Where runner cgroups go: beside the daemon's leaf, or under its own cgroup."""
    v2 = _own_v2_dir()
    return v2.parent if v2 is not None and v2.name == LEAF else v2


def create(name: str, *, max_processes: int | None, memory_limit: int | None) -> RunnerCgroup | None:
    """A new cgroup called ``name`` holding these limits, or None where no
    writable hierarchy with the needed controllers is found."""
    v2 = _runners_base()
    if v2 is not None:
        enabled = set((v2 / "cgroup.subtree_control").read_text().split()) if \
            (v2 / "cgroup.subtree_control").is_file() else set()
        wanted = {c for c, limit in (("pids", max_processes), ("memory", memory_limit)) if limit}
        if wanted <= enabled:
            try:
                d = v2 / name
                d.mkdir(exist_ok=True)
            except OSError:
                d = None
            if d is not None:
                layers = []
                if max_processes and _write(d / "pids.max", str(max_processes)):
                    layers.append("cgroup:pids")
                if memory_limit and _write(d / "memory.max", str(memory_limit)):
                    _write(d / "memory.swap.max", "0")
                    layers.append("cgroup:memory")
                return RunnerCgroup((d,), tuple(layers))
    dirs, layers = [], []
    for controller, limit, knob in (("pids", max_processes, "pids.max"),
                                    ("memory", memory_limit, "memory.limit_in_bytes")):
        base = _v1_dir(controller) if limit else None
        if base is None:
            continue
        d = base / name
        try:
            d.mkdir(exist_ok=True)
        except OSError:
            continue
        if _write(d / knob, str(limit)):
            if controller == "memory":
                _write(d / "memory.memsw.limit_in_bytes", str(limit))
            dirs.append(d)
            layers.append(f"cgroup:{controller}")
        else:
            d.rmdir()
    return RunnerCgroup(tuple(dirs), tuple(layers)) if dirs else None


def remove_stale(prefix: str) -> list[Path]:
    """Remove the empty cgroups named ``<prefix><pid>-...`` whose daemon
    (pid) is gone: what a SIGKILLed daemon's runners left. Returns them."""
    removed = []
    bases = [b for b in (_runners_base(), _v1_dir("pids"), _v1_dir("memory")) if b is not None]
    for base in bases:
        try:
            entries = list(base.iterdir())
        except OSError:
            continue
        for d in entries:
            owner = d.name[len(prefix):].split("-", 1)[0]
            if not d.name.startswith(prefix) or not owner.isdigit() or Path(f"/proc/{owner}").exists():
                continue
            try:
                d.rmdir()
                removed.append(d)
            except OSError:
                pass
    return removed


def _rmdir(d: Path) -> bool:
    try:
        d.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _kill_and_remove(d: Path) -> None:
    for _ in range(50):
        if (d / "cgroup.kill").exists():
            _write(d / "cgroup.kill", "1")
        else:
            try:
                pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if _rmdir(d):
            return
        time.sleep(0.1)
    log.warning("could not remove runner cgroup %s: processes are still in it", d)
