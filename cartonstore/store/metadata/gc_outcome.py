"""The outcome of the store's last collection with a budget, kept in the
index's meta table: a daemon's periodic gc and a `cartonstore gc` run by
hand on the same store both write it, and every process reads the same
answer (/metrics' cartonstore_store_over_budget, GET /v1/node). A
collection with no budget (neither max_size nor min_free) says nothing of
one and leaves it as it is; so does a dry run.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

_KEY = "last_gc"


@dataclass(frozen=True)
class GcOutcome:
    at: float                   # when the collection ended (time.time())
    over_budget: dict | None    # GcReport.over_budget: None when the budget was met

    def as_json(self) -> dict:
        return {"at": self.at, "over_budget": self.over_budget}


def record_gc_outcome(conn: sqlite3.Connection, outcome: GcOutcome) -> None:
    import json  # on first use: `ls` and `path` open the index and read no outcome

    conn.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                 (_KEY, json.dumps(outcome.as_json())))


def read_gc_outcome(conn: sqlite3.Connection) -> GcOutcome | None:
    """None when no collection with a budget ran on this store yet."""
    row = conn.execute("SELECT value FROM meta WHERE key=?", (_KEY,)).fetchone()
    if row is None:
        return None
    import json

    value = json.loads(row[0])
    return GcOutcome(value["at"], value["over_budget"])

