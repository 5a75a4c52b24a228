"""Local sources: where on this host a blob was read from when it was added.

A blob taken from a local .carton file is recorded with the file's path,
size and mtime and its entry's place in the zip (name, local header offset,
compressed size, method); one taken from an unpacked carton directory with
the file's own path, size and mtime. These rows sit next to LINKS URLs
(``links``) and the carton's own URL (``cartons.source``) as the ways an
evicted blob can come back (fetch/local_source.py reads them again, verified
by hash like any fetch).

gc asks ``unsourced_blobs``: a local source counts only while its file still
has the size and mtime recorded (one stat per file, at snapshot time); a
file moved away or modified after the add gives its blobs no source. A file
changed in place with the same size and mtime passes that check and is
caught by the hash when it is read again.

Stores written before this table existed simply have no rows: their blobs
count as sourced only through LINKS or a carton URL.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from ..checks import CheckedCarton
    from ..sources.view import CartonView
    from .index import Index


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


def local_sources_of(view: CartonView, checked: CheckedCarton, *, skip_under: Path) -> list[LocalSource]:
    """The local sources a carton view offers for its blobs; none for a view
    under ``skip_under`` (the store's root: uploads and whole downloads in
    tmp/ are deleted once added, and a model directory under models/ is the
    store's own hardlinks, gone with the blobs gc evicts)."""
    from ..sources import DirCartonView, ZipCartonView

    out: list[LocalSource] = []
    if isinstance(view, ZipCartonView):
        zip_path = view.zip_path.resolve()
        if _is_under(zip_path, skip_under):
            return out
        st = os.stat(zip_path)
        for digest, path in checked.files_by_digest().items():
            e = view.entry(path)
            out.append(LocalSource(digest, str(zip_path), e.name, st.st_size, st.st_mtime_ns,
                                   e.local_header_offset, e.compressed_size, e.method))
    elif isinstance(view, DirCartonView):
        if _is_under(view.root, skip_under):
            return out
        for digest, path in checked.files_by_digest().items():
            full = view.root / path
            try:
                st = os.stat(full)
            except OSError:
                continue
            out.append(LocalSource(digest, str(full), "", st.st_size, st.st_mtime_ns))
    return out


def _is_under(path: Path, top: Path) -> bool:
    top = top.resolve()
    return path == top or top in path.parents


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


def local_sources_for(index: Index, digest: str) -> list[LocalSource]:
    """Most recently recorded first."""
    rows = index.read(lambda conn: conn.execute(
        f"SELECT {_COLUMNS} FROM local_sources WHERE digest=? ORDER BY added_at DESC, path, member",
        (digest,)).fetchall())
    return [LocalSource(*r) for r in rows]


def stale_reason(src: LocalSource) -> str | None:
    """Why this source cannot serve its blob now (None: it looks unchanged)."""
    try:
        st = os.stat(src.path)
    except FileNotFoundError:
        return f"{src.describe()}: the file is gone (moved away or deleted since it was added)"
    except OSError as e:
        return f"{src.describe()}: cannot read it: {e.strerror}"
    if st.st_size != src.file_size or st.st_mtime_ns != src.mtime_ns:
        return (f"{src.describe()}: the file changed since it was added (size {src.file_size} -> "
                f"{st.st_size}, mtime differs: {st.st_mtime_ns != src.mtime_ns})")
    return None


def unsourced_blobs(index: Index, digests: Iterable[str]) -> frozenset[str]:
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

    sourced, local = index.read(query)
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
