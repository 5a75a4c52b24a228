"""A uid and gid of their own for the processes a root daemon runs, where
no user was made for them: as systemd's DynamicUser does, one from the
range it reserves (61184-65519), named in neither /etc/passwd nor
/etc/group, not one systemd has handed a service of its own
(/run/systemd/dynamic-uid/<uid>), run by no live process, and held by this
process for its life through an flock on ``<dir>/<uid>.lock`` in each of
its lock directories: the host's /run/cartonstore/transient-uids and the
store's locks/, which daemons in other containers on the host share
where their /run is their own.

    uid, gid = take((LOCK_DIR, store_locks))   # the same pair on every call in this process
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import random
import threading
from collections.abc import Sequence
from pathlib import Path

FIRST, LAST = 61184, 65519          # systemd's range for dynamic users (uid == gid)
LOCK_DIR = Path("/run/cartonstore/transient-uids")
SYSTEMD_DYNAMIC = Path("/run/systemd/dynamic-uid")   # a file per uid systemd has handed out

_lock = threading.Lock()
_held: tuple[int, int, list[int]] | None = None   # (uid, gid, the lock files' fds, kept open)


def held() -> tuple[int, int] | None:
    """The pair this process took, if it took one."""
    return None if _held is None else _held[:2]


def _named(uid: int) -> bool:
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
    return os.path.lexists(SYSTEMD_DYNAMIC / str(uid))


def _running() -> set[int]:
    """The uids, real, effective, saved or filesystem, of the live processes
    this one can see: from their status (their /proc directory's owner is
    root for a process that is not dumpable, as one that just changed uid)."""
    uids: set[int] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/status") as f:
                    line = next(line for line in f if line.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            uids.update(int(uid) for uid in line.split()[1:])
    return uids


def _lock_all(uid: int, lock_dirs: Sequence[Path]) -> list[int] | None:
    """The flocks on ``uid`` in every directory, or None (nothing held) where one is taken."""
    fds: list[int] = []
    for lock_dir in lock_dirs:
        fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fds.append(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            for taken in fds:
                os.close(taken)
            return None
    return fds


def take(lock_dirs: Sequence[Path] = (LOCK_DIR,), first: int = FIRST, last: int = LAST) -> tuple[int, int]:
    """(uid, gid) from first-last, the same on every call in this process;
    OSError naming the lock directories when none can be taken (no uid left,
    or a directory cannot be made)."""
    global _held
    with _lock:
        if _held is not None:
            return _held[:2]
        for lock_dir in lock_dirs:
            lock_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        running = _running()
        size = last - first + 1
        start = random.randrange(size)   # apart from others' first tries, and from a dead daemon's
        for offset in range(size):
            uid = first + (start + offset) % size
            if uid in running or _named(uid):
                continue
            fds = _lock_all(uid, lock_dirs)
            if fds is not None:
                _held = (uid, uid, fds)
                return uid, uid
        raise OSError(f"no transient uid is free in {first}-{last} (each is named in /etc/passwd or /etc/group, "
                      f"handed out by systemd, runs a process, or is held in "
                      f"{' or '.join(str(d) for d in lock_dirs)})")
