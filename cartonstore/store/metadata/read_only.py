"""The index opened by a user who may read the store but not write it: a
member of the store's group, the files 0640 and the directories 0750.

The index is in WAL mode. A reader reads it in place (``mode=ro``) when
its ``-wal`` and ``-shm`` files exist, which they do while any process has
it open (a daemon): SQLite maps the ``-shm`` read-only and sees every
commit as it lands. When no process has it open, those files are gone
and a reader that may not write the directory cannot make them; the main
file then holds every commit (the last writer checkpointed it before
deleting the WAL), and is copied into memory through ``immutable=1``. That
copy counts only if no writer came meanwhile: a writer changes the main
file only by checkpointing a WAL it must create first, so a copy taken
while no ``-wal`` existed, before and after, from a main file whose
inode, size and times did not change, is the index as the last writer
left it. ``immutable`` in place would be wrong: a daemon starting during
the read would checkpoint pages under it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from cartonstore.errors import NotFound, PermissionDenied, Unavailable
from cartonstore.system.file_access import READ, denial

ATTEMPTS = 12   # in place, else a copy; again while writers open and close it between two looks


def open_read_only(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    """A connection that reads the index at ``path`` and cannot write it.
    PermissionDenied names the file this user may not read, its owner, mode
    and the group to join; NotFound when there is no index."""
    problem: sqlite3.Error | None = None
    for attempt in range(ATTEMPTS):
        try:
            return _in_place(path, busy_timeout_ms)
        except sqlite3.Error as e:
            problem = e
        if not os.path.exists(path):
            break
        if not os.path.exists(_wal_of(path)):
            copy = _copied_while_closed(path)
            if copy is not None:
                return copy
        # a writer opened or closed the index between two looks: look again
        time.sleep(min(0.001 * 2 ** attempt, 0.05))
    if (denied := permission_error(path, READ)) is not None:
        raise denied
    if not os.path.exists(path):
        raise NotFound(f"no store at {path.parent} (no index.db there)", subject=str(path))
    raise Unavailable(f"cannot read index {path}: {problem}", subject=str(path))


def _in_place(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=busy_timeout_ms / 1000,
                           isolation_level=None, check_same_thread=False)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()   # opens the WAL: its errors come here
    except BaseException:
        conn.close()
        raise
    return conn


def _copied_while_closed(path: Path) -> sqlite3.Connection | None:
    """The index copied into memory from its main file, or None when a
    writer opened it meanwhile (then it is read in place)."""
    before = _state(path)
    if before is None:
        return None
    source = sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True)
    copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    try:
        source.backup(copy)
    except sqlite3.Error:
        copy.close()
        return None
    finally:
        source.close()
    if _state(path) != before:
        copy.close()
        return None
    return copy


def _state(path: Path) -> tuple[int, ...] | None:
    """The main file as a writer would leave a trace on it; None while a WAL exists."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return None if os.path.exists(_wal_of(path)) else (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _wal_of(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def permission_error(path: Path, want: int) -> PermissionDenied | None:
    """Why this user may not open the index at ``path`` to ``want`` (READ,
    WRITE): the first of its files, or of the directories above, it may not
    use so, with its owner, mode and who may; None when none stops it."""
    for file in (path, _wal_of(path), path.with_name(path.name + "-shm")):
        line = denial(file, want)
        if line is not None:
            doing = "read" if want == READ else "change"
            return PermissionDenied(f"this user may not {doing} the store: {line}", subject=str(file))
    return None
