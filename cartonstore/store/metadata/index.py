"""The SQLite index (ROOT/index.db): what the store holds and how it is named.

The index is the map, the blob files are the territory: a row in ``blobs``
claims a verified file exists; ``verify`` checks the claim. Rows are written
only after the files they describe are durable, so a crash leaves files
without rows (garbage for gc), never rows without files.

One connection per Index, guarded by a lock so worker threads can share it;
every write runs in ``BEGIN IMMEDIATE`` so concurrent writers from other
processes queue on the busy timeout instead of failing on lock upgrade.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from cartonstore.errors import CartonStoreError, PermissionDenied, Unavailable
from cartonstore.system.file_access import WRITE, denial

from .gc_outcome import GcOutcome, read_gc_outcome, record_gc_outcome
from .lease_rows import TOUCH_AFTER, LeaseQueries, touch_carton
from .model_states import ModelState, read_model_states
from .names import NameOutcome, assign_name
from .schema import SCHEMA, SCHEMA_VERSION, migrate_leases, migrate_source_bytes
from .sizes import learn_all_sizes, learn_sizes
from .source_bytes import SourceBytes, add_source_bytes, read_source_bytes
from .source_rows import SourceQueries
from .sqlite_ops import rollback, run_ops

# Entries and local sources are imported by the methods that use them: `path`
# opens the index to read a carton's row and blobs, and starts fast.
if TYPE_CHECKING:
    from cartonstore.format.entry import EntryRow

    from .adopted_rows import AdoptedBlob
    from .source_rows import LocalSource

T = TypeVar("T")
BUSY_TIMEOUT_MS = 30_000
WAL_AUTOCHECKPOINT_PAGES = 1000  # SQLite's default


@dataclass(frozen=True)
class CartonRow:
    digest: str
    model_name: str | None
    runner_name: str | None
    file_count: int
    total_size: int | None
    source: str | None
    added_at: float
    last_used: float


@dataclass(frozen=True)
class CartonRecord:
    """Everything the index learns about a carton when it becomes known."""

    row: CartonRow
    entries: Sequence[EntryRow]
    links: dict[str, tuple[str, ...]]
    local_sources: Sequence[LocalSource] = ()
    adopted: Sequence[AdoptedBlob] = ()
    """Blobs that are the adopted file's inode (store/adoption.py)."""


class Index(LeaseQueries, SourceQueries):
    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        """``read_only``: for a user who may read the store but not write it
        (store/metadata/read_only.py); every write then raises PermissionDenied."""
        self.path = path
        self.read_only = read_only
        self._lock = threading.RLock()
        if read_only:
            from .read_only import open_read_only

            self.conn = open_read_only(path, BUSY_TIMEOUT_MS)
            return
        try:
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                   check_same_thread=False)
            # Plain sqlite3: sqlite_utils (~100 ms to import on every command) served only the journal mode.
            self.conn = conn
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA foreign_keys=ON")
            _use_wal(conn)
            # NORMAL in WAL mode may lose the last commits on power loss, never
            # corrupt. That is safe here: files are made durable before the rows
            # that claim them, so a lost commit leaves files without rows
            # (garbage for gc), never rows without files. It keeps a lease
            # (one small commit) well under a millisecond.
            conn.execute("PRAGMA synchronous=NORMAL")
            with self.transaction():
                for stmt in filter(str.strip, SCHEMA.split(";")):
                    conn.execute(stmt)
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                migrate_leases(conn)
                migrate_source_bytes(conn)
                if conn.execute("INSERT OR IGNORE INTO meta VALUES ('sizes_learned', '1')").rowcount:
                    learn_all_sizes(conn)  # once: stores written before sizes were learned late
        except (sqlite3.Error, Unavailable) as e:
            from .read_only import permission_error  # a store this user may only read, named as such

            raise permission_error(path, WRITE) or (e if isinstance(e, Unavailable) else Unavailable(
                f"cannot open index {path}: {e}", subject=str(path))) from e

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        if self.read_only:
            raise self.write_refused()
        with self._lock:
            conn = self.conn
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as e:
                raise Unavailable(f"index {self.path} is busy: {e}", subject=str(self.path)) from e
            try:
                yield conn
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                rollback(conn)
                raise Unavailable(f"index {self.path}: {e}", subject=str(self.path)) from e
            except BaseException:
                rollback(conn)
                raise

    def write_refused(self, doing: str = "this command") -> PermissionDenied:
        """What a write to an index opened read-only raises: who may write it."""
        why = denial(self.path, WRITE) or f"{self.path} is open read-only"
        return PermissionDenied(f"{doing} would change the store, which this user may only read: {why}",
                                subject=str(self.path))

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """fn(conn) outside a write transaction (plain reads)."""
        with self._lock:
            return fn(self.conn)

    def _rows(self, sql: str, params: Sequence | dict = ()) -> list[tuple]:
        with self._lock:
            return self.conn.execute(sql, params).fetchall()

    # -- blobs -------------------------------------------------------------

    def add_blobs(self, conn: sqlite3.Connection, blobs: Iterable[tuple[str, int]]) -> None:
        now = time.time()
        conn.executemany("INSERT OR IGNORE INTO blobs(digest,size,added_at) VALUES (?,?,?)",
                         [(d, s, now) for d, s in blobs])

    def record_blobs(self, blobs: Iterable[tuple[str, int]], *, figures: Iterable[SourceBytes] = ()) -> None:
        """Rows for blobs now durable; the entries and cartons that list them
        learn their sizes, and the store's figures by kind of source grow by
        ``figures``, in the same transaction (see sizes.py, source_bytes.py)."""
        blobs = list(blobs)
        with self.transaction() as conn:
            self.add_blobs(conn, blobs)
            learn_sizes(conn, (d for d, _ in blobs))
            add_source_bytes(conn, figures)

    def forget_blob(self, digest: str) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM blobs WHERE digest=?", (digest,))

    def blob_rows(self) -> list[tuple[str, int]]:
        return [(r[0], r[1]) for r in self._rows("SELECT digest, size FROM blobs ORDER BY digest")]

    def links_for(self, digest: str) -> list[str]:
        return [r[0] for r in self._rows("SELECT url FROM links WHERE digest=? ORDER BY position", (digest,))]

    def add_links(self, links: Mapping[str, Sequence[str]]) -> None:
        """More URLs each blob can be fetched from (after those known)."""
        with self.transaction() as conn:
            _insert_links(conn, links)

    # -- cartons -----------------------------------------------------------

    def record_carton(self, rec: CartonRecord, *, blobs: Iterable[tuple[str, int]], name: str | None,
                      default_name: str | None = None, force: bool = False,
                      figures: Iterable[SourceBytes] = ()) -> NameOutcome:
        """Make a carton known in one transaction: its row, entries, links,
        the blobs just committed, the adopted files among them, what they add
        to the figures by kind of source, and its name (see names.assign_name: an explicit name may
        move, a default one only takes a free name)."""
        r = rec.row
        with self.transaction() as conn:
            self.add_blobs(conn, blobs)
            conn.execute(
                "INSERT INTO cartons VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(digest) DO UPDATE SET "
                "model_name=excluded.model_name, runner_name=excluded.runner_name, "
                "total_size=coalesce(excluded.total_size, total_size), last_used=excluded.last_used",
                (r.digest, r.model_name, r.runner_name, r.file_count, r.total_size, r.source,
                 r.added_at, r.last_used),
            )
            conn.executemany(  # a size learned earlier is kept when the carton is added again
                "INSERT INTO entries VALUES (?,?,?,?,?,?) ON CONFLICT(carton, path) DO UPDATE SET "
                "digest=excluded.digest, size=coalesce(excluded.size, size), kind=excluded.kind, "
                "target=excluded.target",
                [(r.digest, e.path, e.digest, e.size, e.kind, e.target) for e in rec.entries],
            )
            learn_sizes(conn, (e.digest for e in rec.entries if e.size is None and e.kind == "file"))
            _insert_links(conn, rec.links)
            from .source_rows import record_local_sources

            record_local_sources(conn, rec.local_sources)
            if rec.adopted:
                from .adopted_rows import record_adopted

                record_adopted(conn, rec.adopted)
            add_source_bytes(conn, figures)
            return assign_name(conn, r.digest, explicit=name, default=default_name, force=force)

    def carton(self, digest: str) -> CartonRow | None:
        rows = self._rows("SELECT * FROM cartons WHERE digest=?", (digest,))
        return CartonRow(*rows[0]) if rows else None

    def cartons(self) -> list[CartonRow]:
        return [CartonRow(*r) for r in self._rows("SELECT * FROM cartons ORDER BY added_at, digest")]

    def entries(self, carton: str) -> list[EntryRow]:
        from cartonstore.format.entry import EntryRow

        rows = self._rows("SELECT path,digest,size,kind,target FROM entries WHERE carton=? ORDER BY path",
                          (carton,))
        return [EntryRow(*r) for r in rows]

    def missing_blobs(self, carton: str) -> list[str]:
        rows = self._rows(
            "SELECT DISTINCT e.digest FROM entries e LEFT JOIN blobs b ON b.digest=e.digest "
            "WHERE e.carton=? AND b.digest IS NULL ORDER BY e.digest", (carton,))
        return [r[0] for r in rows]

    def names_of(self, carton: str) -> list[str]:
        return [r[0] for r in self._rows("SELECT name FROM names WHERE carton=? ORDER BY name", (carton,))]

    def carton_for_name(self, name: str) -> str | None:
        rows = self._rows("SELECT carton FROM names WHERE name=?", (name,))
        return rows[0][0] if rows else None

    def cartons_with_prefix(self, prefix: str) -> list[str]:
        return [r[0] for r in self._rows(
            "SELECT digest FROM cartons WHERE digest >= ? AND digest < ? ORDER BY digest",
            (prefix, prefix + "g"))]

    def touch(self, carton: str) -> None:
        """The carton counts as used now (for LRU eviction): written only
        when its last use is older than TOUCH_AFTER, so that `path` run in a
        loop reads the index and writes nothing."""
        now = time.time()
        fresh = self._rows("SELECT 1 FROM cartons WHERE digest=? AND last_used>=?", (carton, now - TOUCH_AFTER))
        # Fresh: no write transaction either, it would wait behind a busy daemon's writers for nothing.
        # Read-only: a user who may only read the store goes unrecorded.
        if fresh or self.read_only:
            return
        with self.transaction() as conn:
            touch_carton(conn, carton, now)

    def remove_carton(self, carton: str) -> list[str]:
        """Forget a carton; returns the blobs no other carton lists any more
        (their rows and links are dropped in the same transaction, so the
        caller unlinks files only after the index stopped claiming them)."""
        with self.transaction() as conn:
            digests = [r[0] for r in conn.execute(
                "SELECT DISTINCT digest FROM entries WHERE carton=?", (carton,))]
            conn.execute("DELETE FROM entries WHERE carton=?", (carton,))
            conn.execute("DELETE FROM names WHERE carton=?", (carton,))
            conn.execute("DELETE FROM leases WHERE carton=?", (carton,))
            conn.execute("DELETE FROM cartons WHERE digest=?", (carton,))
            orphans = [d for d in [*digests, carton]
                       if not conn.execute("SELECT 1 FROM entries WHERE digest=? LIMIT 1", (d,)).fetchone()
                       and not conn.execute("SELECT 1 FROM cartons WHERE digest=?", (d,)).fetchone()]
            for d in orphans:
                conn.execute("DELETE FROM blobs WHERE digest=?", (d,))
                conn.execute("DELETE FROM links WHERE digest=?", (d,))
            from .source_rows import forget_local_sources

            forget_local_sources(conn, orphans)
            return orphans

    def paths_of_blob(self, digest: str) -> list[str]:
        """Every carton path that lists this blob (to validate it by its names)."""
        return [r[0] for r in self._rows("SELECT DISTINCT path FROM entries WHERE digest=?", (digest,))]

    def sources_of_blob(self, digest: str) -> list[str]:
        """The sources the cartons that list this blob were added from."""
        return [r[0] for r in self._rows("SELECT DISTINCT c.source FROM entries e "
                                         "JOIN cartons c ON c.digest = e.carton "
                                         "WHERE e.digest=? AND c.source IS NOT NULL", (digest,))]

    def carton_for_source(self, source: str) -> CartonRow | None:
        rows = self._rows("SELECT * FROM cartons WHERE source=? ORDER BY added_at DESC LIMIT 1", (source,))
        return CartonRow(*rows[0]) if rows else None

    # -- gc ----------------------------------------------------------------

    def blob_table(self) -> dict[str, tuple[int, float]]:
        return {r[0]: (r[1], r[2]) for r in self._rows("SELECT digest, size, added_at FROM blobs")}

    def carton_listing(self) -> tuple[list[CartonRow], dict[str, set[str]], dict[str, set[str]]]:
        """Every carton, the blobs each lists, and the blobs that keep each known
        (carton.toml; the MANIFEST is the carton's own digest)."""
        cartons = self.cartons()
        listed: dict[str, set[str]] = {c.digest: set() for c in cartons}
        keep: dict[str, set[str]] = {c.digest: set() for c in cartons}
        for carton, digest, path in self._rows("SELECT carton, digest, path FROM entries"):
            listed.setdefault(carton, set()).add(digest)
            if path == "carton.toml":
                keep.setdefault(carton, set()).add(digest)
        return cartons, listed, keep

    def cartons_added_since(self, when: float) -> list[str]:
        return [r[0] for r in self._rows("SELECT digest FROM cartons WHERE added_at>=?", (when,))]

    def leased_cartons(self, now: float) -> set[str]:
        return {r[0] for r in self._rows("SELECT DISTINCT carton FROM leases WHERE expires_at>?", (now,))}

    def forget_blobs(self, digests: Iterable[str]) -> None:
        """Drop blob rows in one transaction (gc: rows first, files after)."""
        digests = list(digests)
        if not digests:
            return
        with self.transaction() as conn:
            conn.executemany("DELETE FROM blobs WHERE digest=?", [(d,) for d in digests])

    @contextmanager
    def checkpoints_deferred(self) -> Iterator[Callable[[], None]]:
        """Within this block, this connection's commits never checkpoint the
        WAL; call the yielded function to checkpoint (passively: other
        writers go on) at a moment of the caller's choosing, e.g. outside a
        lock others wait for. gc commits many small transactions while
        leases wait on the store lock; an automatic checkpoint (pages copied,
        files synced) inside one of them would hold the lock for tens of ms."""
        with self._lock:
            self.conn.execute("PRAGMA wal_autocheckpoint=0")
        try:
            yield self.checkpoint
        finally:
            with self._lock:
                self.conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
            self.checkpoint()

    def sync_wal(self) -> None:
        """fsync the WAL file, so that a checkpoint soon after has little left
        to sync (see store/group_commit.py); changes nothing SQLite sees."""
        try:
            fd = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as e:
            raise Unavailable(f"index {self.path}: cannot open its WAL: {e.strerror}", subject=str(self.path)) from e
        try:
            getattr(os, "fdatasync", os.fsync)(fd)  # macOS has no fdatasync
        except OSError as e:
            raise Unavailable(f"index {self.path}: WAL sync failed: {e.strerror}", subject=str(self.path)) from e
        finally:
            os.close(fd)

    def checkpoint(self) -> None:
        """Copy the WAL into the database as far as no reader needs it
        (PASSIVE: writers in other connections go on meanwhile)."""
        with self._lock:
            try:
                self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error as e:
                raise Unavailable(f"index {self.path}: checkpoint failed: {e}", subject=str(self.path)) from e

    def run_batch(self, ops: Sequence[Callable[[sqlite3.Connection], T]]) -> list[T | CartonStoreError]:
        """Run small operations in one transaction (one commit for many
        requests). An operation that raises a CartonStoreError gets it as its
        result; the writes it made before raising are kept, the others' too."""
        with self.transaction() as conn:
            return run_ops(conn, ops)

    def stored_bytes(self) -> int:
        return self._rows("SELECT coalesce(sum(size), 0) FROM blobs")[0][0]

    def source_bytes(self) -> list[SourceBytes]:
        """The store's figures by kind of source (source_bytes.py)."""
        return self.read(read_source_bytes)

    def model_states(self, now: float | None = None) -> list[ModelState]:
        """Every carton: cached or partial, leased, loaded (model_states.py)."""
        return self.read(lambda conn: read_model_states(conn, time.time() if now is None else now))

    def record_gc_outcome(self, outcome: GcOutcome) -> None:
        with self.transaction() as conn:
            record_gc_outcome(conn, outcome)

    def last_gc_outcome(self) -> GcOutcome | None:
        """The last collection with a budget (gc_outcome.py); None before one."""
        return self.read(read_gc_outcome)


def _insert_links(conn: sqlite3.Connection, links: Mapping[str, Sequence[str]]) -> None:
    for digest, urls in links.items():
        base = conn.execute("SELECT coalesce(max(position)+1, 0) FROM links WHERE digest=?", (digest,)).fetchone()[0]
        conn.executemany("INSERT OR IGNORE INTO links VALUES (?,?,?)",
                         [(digest, u, base + i) for i, u in enumerate(urls)])


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch a new index to WAL. Processes opening one new store at once
    race for it, and SQLite answers the loser's switch "database is
    locked" at once, without waiting out busy_timeout (8 processes at once
    lost it about once in 20 tries): so it is tried again until the timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=wal")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)
