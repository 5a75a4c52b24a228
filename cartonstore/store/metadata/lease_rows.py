"""The index's leases table: claims loaders (and the daemon's pins) hold
on cartons, each with an expiry. A mixin of store.index.Index, whose
connection, transactions and batches it uses. Also the one write every
use of a carton makes (touch_carton: its last use, for LRU eviction),
which a lease is.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from cartonstore.errors import CartonStoreError, NotFound

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

T = TypeVar("T")


@dataclass(frozen=True)
class LeaseRow:
    id: str
    carton: str
    holder: str | None
    created_at: float
    expires_at: float


TOUCH_AFTER = 10.0
"""Seconds a carton's last use may lag behind: a use within them writes nothing."""


def touch_carton(conn: sqlite3.Connection, carton: str, now: float) -> None:
    """The carton was used now."""
    # LRU needs minutes, not microseconds: skipping fresh rows spares a
    # page write on every lease of a busy model.
    conn.execute("UPDATE cartons SET last_used=? WHERE digest=? AND last_used<?", (now, carton, now - TOUCH_AFTER))


class LeaseQueries:
    """Index's lease methods (Index provides transaction, run_batch and _rows)."""

    if TYPE_CHECKING:
        def transaction(self) -> AbstractContextManager[sqlite3.Connection]: ...
        def run_batch(self, ops: Sequence[Callable[[sqlite3.Connection], T]]) -> list[T | CartonStoreError]: ...
        def _rows(self, sql: str, params: Sequence | dict = ()) -> list[tuple]: ...

    def count_expired_leases(self, now: float) -> int:
        return self._rows("SELECT count(*) FROM leases WHERE expires_at<=?", (now,))[0][0]

    def create_lease(self, carton: str, ttl: float, holder: str | None = None,
                     lease_id: str | None = None) -> LeaseRow:
        """A new lease (or, with a fixed lease_id, a renewed pin); the carton
        counts as used now."""
        with self.transaction() as conn:
            return self.insert_lease(conn, carton, ttl, holder, lease_id)

    def renew_lease(self, lease_id: str, ttl: float) -> LeaseRow:
        """Extend a live lease; NotFound for an unknown or expired one."""
        results = self.run_batch([lambda conn: self.extend_lease(conn, lease_id, ttl)])
        if isinstance(results[0], Exception):
            raise results[0]
        return results[0]

    def delete_lease(self, lease_id: str) -> bool:
        with self.transaction() as conn:
            return self.drop_lease(conn, lease_id)

    # The same three, inside a caller's transaction (see run_batch).

    def insert_lease(self, conn: sqlite3.Connection, carton: str, ttl: float, holder: str | None,
                     lease_id: str | None) -> LeaseRow:
        now = time.time()
        import secrets  # here: opening the index to read it (`path`) needs no random source

        row = LeaseRow(lease_id or secrets.token_urlsafe(16), carton, holder, now, now + ttl)
        conn.execute("INSERT OR REPLACE INTO leases VALUES (?,?,?,?,?)",
                     (row.id, row.carton, row.holder, row.created_at, row.expires_at))
        touch_carton(conn, carton, now)
        return row

    def extend_lease(self, conn: sqlite3.Connection, lease_id: str, ttl: float) -> LeaseRow:
        now = time.time()
        found = conn.execute("SELECT * FROM leases WHERE id=?", (lease_id,)).fetchone()
        if found is None:
            raise NotFound(f"no lease {lease_id!r} (never taken, released, or collected)", subject=lease_id)
        row = LeaseRow(*found)
        if row.expires_at <= now:
            conn.execute("DELETE FROM leases WHERE id=?", (lease_id,))
            raise NotFound(f"lease {lease_id!r} expired {now - row.expires_at:.1f}s ago; take a new one",
                           subject=lease_id)
        row = LeaseRow(row.id, row.carton, row.holder, row.created_at, now + ttl)
        conn.execute("UPDATE leases SET expires_at=? WHERE id=?", (row.expires_at, lease_id))
        touch_carton(conn, row.carton, now)
        return row

    @staticmethod
    def drop_lease(conn: sqlite3.Connection, lease_id: str) -> bool:
        return conn.execute("DELETE FROM leases WHERE id=?", (lease_id,)).rowcount > 0

    def lease(self, lease_id: str) -> LeaseRow | None:
        rows = self._rows("SELECT * FROM leases WHERE id=?", (lease_id,))
        return LeaseRow(*rows[0]) if rows else None

    def expire_leases(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        with self.transaction() as conn:
            return conn.execute("DELETE FROM leases WHERE expires_at<=?", (now,)).rowcount

    def count_live_leases(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        return self._rows("SELECT count(*) FROM leases WHERE expires_at>?", (now,))[0][0]

    def lease_ids_with_prefix(self, prefix: str) -> list[str]:
        return [r[0] for r in self._rows("SELECT id FROM leases WHERE substr(id, 1, ?)=?", (len(prefix), prefix))]

    def delete_leases(self, ids: list[str]) -> None:
        with self.transaction() as conn:
            conn.executemany("DELETE FROM leases WHERE id=?", [(i,) for i in ids])

    def live_leases(self, carton: str, now: float | None = None) -> list[LeaseRow]:
        now = time.time() if now is None else now
        rows = self._rows("SELECT * FROM leases WHERE carton=? AND expires_at>? ORDER BY expires_at", (carton, now))
        return [LeaseRow(*r) for r in rows]
