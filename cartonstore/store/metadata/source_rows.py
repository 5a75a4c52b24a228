"""The index's local_sources table: where on this host a blob was read
from when it was added (see store/metadata/local_sources.py for what a local source is and how
one is found). A mixin of store.index.Index, which owns the table: the rows
are written inside its transactions and read through its connection.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class LocalSource:
    digest: str
    path: str                        # absolute path of the .carton, or of the file in a directory
    member: str                      # zip entry name; "" for a file of a directory source
    file_size: int
    mtime_ns: int
    header_offset: int | None = None  # zip only: where the entry's local header starts
    compressed_size: int | None = None
    method: int | None = None

    @property
    def in_zip(self) -> bool:
        return self.member != ""

    def describe(self) -> str:
        return f"{self.path} (entry {self.member})" if self.in_zip else self.path


_COLUMNS = "digest, path, member, file_size, mtime_ns, header_offset, compressed_size, method"


_COLUMNS = "digest, path, member, file_size, mtime_ns, header_offset, compressed_size, method"


def record_local_sources(conn: sqlite3.Connection, sources: Iterable[LocalSource]) -> None:
    """Inside the caller's transaction (Index.record_carton): a file added
    again replaces what was recorded of it."""
    now = time.time()
    conn.executemany(
        f"INSERT OR REPLACE INTO local_sources ({_COLUMNS}, added_at) VALUES (?,?,?,?,?,?,?,?,?)",
        [(s.digest, s.path, s.member, s.file_size, s.mtime_ns, s.header_offset, s.compressed_size,
          s.method, now) for s in sources])


def forget_local_sources(conn: sqlite3.Connection, digests: Iterable[str]) -> None:
    conn.executemany("DELETE FROM local_sources WHERE digest=?", [(d,) for d in digests])


class SourceQueries:
    """Reads of local_sources; Index provides ``read``."""

    read: Callable[[Callable[[sqlite3.Connection], T]], T]

    def local_sources_for(self, digest: str) -> list[LocalSource]:
        """Most recently recorded first."""
        rows = self.read(lambda conn: conn.execute(
            f"SELECT {_COLUMNS} FROM local_sources WHERE digest=? ORDER BY added_at DESC, path, member",
            (digest,)).fetchall())
        return [LocalSource(*r) for r in rows]

    def unsourced_blobs(self, digests: Iterable[str]) -> frozenset[str]:
        """Of ``digests``, those with no way back once evicted: no LINKS URL, no
        carton added by URL that lists them, no local source whose file still
        has its recorded size and mtime."""
        def query(conn: sqlite3.Connection) -> tuple[set[str], list[tuple[str, str, int, int]]]:
            sourced = {r[0] for r in conn.execute("SELECT DISTINCT digest FROM links")}
            sourced.update(r[0] for r in conn.execute(
                "SELECT DISTINCT e.digest FROM entries e JOIN cartons c ON c.digest=e.carton "
                "WHERE c.source LIKE 'http://%' OR c.source LIKE 'https://%'"))
            local = conn.execute("SELECT digest, path, file_size, mtime_ns FROM local_sources").fetchall()
            return sourced, local

        sourced, local = self.read(query)
        alive: dict[tuple[str, int, int], bool] = {}
        for digest, path, size, mtime_ns in local:
            if digest in sourced:
                continue
            key = (path, size, mtime_ns)
            if key not in alive:
                try:
                    st = os.stat(path)
                    alive[key] = st.st_size == size and st.st_mtime_ns == mtime_ns
                except OSError:
                    alive[key] = False
            if alive[key]:
                sourced.add(digest)
        return frozenset(d for d in digests if d not in sourced)
