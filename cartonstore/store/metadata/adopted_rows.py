"""The index's adopted_blobs table: blobs that are a file another tool keeps
(a Hugging Face or Ollama blob hard-linked in by ``cartonstore adopt``),
with the file's size, mtime and inode when it was adopted.

The blob and the other tool's file are one inode: a write through the
other path changes the blob. A blob whose stat no longer matches its row
is looked at before it is handed out (store/adoption.py). A row goes with
its blob's row (ON DELETE CASCADE): rm, gc and verify --repair forget it
without knowing of it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class AdoptedBlob:
    digest: str
    path: str          # the file it was adopted from (the other tool's name for the inode)
    size: int
    mtime_ns: int
    ino: int
    dev: int

    @classmethod
    def of(cls, digest: str, path: str, st: os.stat_result) -> AdoptedBlob:
        return cls(digest, path, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)

    def change(self, st: os.stat_result) -> str | None:
        """How the blob file's stat differs from the adopted file's (None: it does not)."""
        if (st.st_ino, st.st_dev) != (self.ino, self.dev):
            return "it is no longer the inode adopted"
        if st.st_size != self.size:
            return f"its size changed from {self.size} to {st.st_size} bytes"
        if st.st_mtime_ns != self.mtime_ns:
            return "it was modified since it was adopted (its mtime changed)"
        return None


_COLUMNS = "digest, path, size, mtime_ns, ino, dev"


def record_adopted(conn: sqlite3.Connection, rows: Iterable[AdoptedBlob]) -> None:
    """In the caller's transaction, after the blobs' own rows."""
    now = time.time()
    conn.executemany(f"INSERT OR REPLACE INTO adopted_blobs ({_COLUMNS}, added_at) VALUES (?,?,?,?,?,?,?)",
                     [(r.digest, r.path, r.size, r.mtime_ns, r.ino, r.dev, now) for r in rows])


def lists_adopted(conn: sqlite3.Connection, carton: str) -> bool:
    """Whether the carton lists an adopted blob; one probe of an empty
    table when the store has none (a lease asks this each time)."""
    try:
        if conn.execute("SELECT 1 FROM adopted_blobs LIMIT 1").fetchone() is None:
            return False
    except sqlite3.OperationalError:   # a store an older cartonstore wrote, opened read-only: nothing adopted
        return False
    return conn.execute("SELECT 1 FROM entries e JOIN adopted_blobs a ON a.digest = e.digest WHERE e.carton = ? "
                        "LIMIT 1", (carton,)).fetchone() is not None


def all_adopted(conn: sqlite3.Connection) -> list[AdoptedBlob]:
    try:
        return [AdoptedBlob(*r) for r in conn.execute(f"SELECT {_COLUMNS} FROM adopted_blobs")]
    except sqlite3.OperationalError:   # a store an older cartonstore wrote, opened read-only: nothing adopted
        return []


def adopted_of_carton(conn: sqlite3.Connection, carton: str) -> list[AdoptedBlob]:
    """The adopted blobs a carton lists."""
    if not lists_adopted(conn, carton):
        return []
    rows = conn.execute(f"SELECT DISTINCT {', '.join('a.' + c for c in _COLUMNS.split(', '))} "
                        "FROM entries e JOIN adopted_blobs a ON a.digest = e.digest WHERE e.carton = ?",
                        (carton,)).fetchall()
    return [AdoptedBlob(*r) for r in rows]


def cartons_listing(conn: sqlite3.Connection, digest: str) -> list[str]:
    return [r[0] for r in conn.execute("SELECT DISTINCT carton FROM entries WHERE digest=? ORDER BY carton",
                                       (digest,))]
