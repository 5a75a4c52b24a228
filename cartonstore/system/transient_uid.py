"""A uid and gid of their own for the processes a root daemon runs, where
no user was made for them: as systemd's DynamicUser does, one from the
range it reserves (61184-65519), named in neither /etc/passwd nor
/etc/group, run by no live process, and held by this process for its life
through an flock on ``<LOCK_DIR>/<uid>.lock``, so that two daemons on one
host never share one.

    uid, gid = take()   # the same pair on every call in this process
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import random
import threading
from pathlib import Path

FIRST, LAST = 61184, 65519          # systemd's range for dynamic users (uid == gid)
LOCK_DIR = Path("/run/cartonstore/transient-uids")

_lock = threading.Lock()
_held: tuple[int, int, int] | None = None   # (uid, gid, the lock file's fd, kept open)


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
    return False


def _running() -> set[int]:
    """The uids that own a live process (its /proc directory)."""
    uids = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                uids.add(entry.stat(follow_symlinks=False).st_uid)
            except OSError:
                continue
    return uids


def take(lock_dir: Path = LOCK_DIR) -> tuple[int, int]:
    """(uid, gid), the same on every call in this process; OSError naming
    the lock directory when none can be taken (no range left, or the
    directory cannot be made)."""
    global _held
    with _lock:
        if _held is not None:
            return _held[:2]
        lock_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        running = _running()
        start = random.randrange(FIRST, LAST + 1)   # apart from others' first tries, and from a dead daemon's
        for offset in range(LAST - FIRST + 1):
            uid = FIRST + (start - FIRST + offset) % (LAST - FIRST + 1)
            if uid in running or _named(uid):
                continue
            fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _held = (uid, uid, fd)
            return uid, uid
        raise OSError(f"no transient uid is free in {FIRST}-{LAST} (each is named in /etc/passwd or /etc/group, "
                      f"runs a process, or is held in {lock_dir})")
