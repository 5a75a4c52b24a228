"""The index's loaded_models table: what each daemon (known by its
identity, server.id, by default its API socket's path) has loaded, so that
a restarted daemon loads it again.
Functions of a connection, run inside the caller's transaction or batch."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class LoadedRow:
    name: str
    carton: str            # the version that was loaded (its manifest hash)
    config: str | None     # the load's Triton config, as JSON text


def remember_loaded(conn: sqlite3.Connection, daemon: str, name: str, carton: str, config: str | None) -> None:
    conn.execute("INSERT OR REPLACE INTO loaded_models VALUES (?, ?, ?, ?, ?)",
                 (daemon, name, carton, config, time.time()))


def forget_loaded(conn: sqlite3.Connection, daemon: str, name: str) -> None:
    conn.execute("DELETE FROM loaded_models WHERE daemon=? AND name=?", (daemon, name))


def loaded_by(conn: sqlite3.Connection, daemon: str) -> list[LoadedRow]:
    """In the order they were loaded."""
    rows = conn.execute("SELECT name, carton, config FROM loaded_models WHERE daemon=? ORDER BY loaded_at, name",
                        (daemon,)).fetchall()
    return [LoadedRow(*row) for row in rows]
