"""Running small index operations: in one transaction each keeps its own
result or error (Index.run_batch); and the daemon's second connection that
never waits (ImmediateWriter)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from cartonstore.errors import CartonStoreError

T = TypeVar("T")


def rollback(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # a failed COMMIT may already have ended the transaction


def run_ops(conn: sqlite3.Connection, ops: Sequence[Callable[[sqlite3.Connection], T]]
             ) -> list[T | CartonStoreError]:
    """Each op's result, or the CartonStoreError it raised (its earlier writes kept)."""
    out: list[T | CartonStoreError] = []
    for op in ops:
        try:
            out.append(op(conn))
        except CartonStoreError as e:
            out.append(e)
    return out


WOULD_WAIT = object()  # ImmediateWriter.try_run: another writer holds the database


class ImmediateWriter:
    """A second connection to the index for small writes that must never
    wait: for the daemon's event loop, which takes a lease this way in tens
    of microseconds instead of two thread hops.

    It never sleeps on SQLite's busy handler (busy_timeout 0) and never
    checkpoints: after ``checkpoint_due`` commits its owner should run
    Index.checkpoint() off the loop and call ``checkpointed()``.
    """

    # A lease commit writes a page or two (the leases row's, schema 2, and
    # now and then the carton's last_used): 1,000 commits make a WAL of
    # 5-10 MiB before a checkpoint lets it start over. Each checkpoint makes writes
    # wait a few ms (store/group_commit.py), so fewer are better for the
    # tail; the bigger WAL is synced beforehand, off the loop.
    CHECKPOINT_EVERY = 1000

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA busy_timeout=0")
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA wal_autocheckpoint=0")
        self._commits = 0

    @property
    def checkpoint_due(self) -> bool:
        return self._commits >= self.CHECKPOINT_EVERY

    def checkpointed(self) -> None:
        self._commits = 0

    def try_run(self, ops: Sequence[Callable[[sqlite3.Connection], T]]) -> list[T | CartonStoreError] | object:
        """ops in one transaction, with Index.run_batch's results; or
        WOULD_WAIT, nothing written, when the database is busy or failing
        (the caller then goes the patient way, which reports real failures)."""
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            return WOULD_WAIT
        try:
            out = run_ops(conn, ops)
            conn.execute("COMMIT")
        except sqlite3.Error:
            rollback(conn)
            return WOULD_WAIT
        except BaseException:
            rollback(conn)
            raise
        self._commits += 1
        return out

    def close(self) -> None:
        self.conn.close()
