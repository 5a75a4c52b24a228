"""What the store holds, model by model, as an operator or a scheduler asks
it (GET /v1/node, /metrics): each carton's names and size, whether all its
blobs are stored (cached) or some were evicted (partial), and what keeps it
from gc: leases (a client's, a mounted volume's) and daemons' pins (loaded).

Read from the index in a handful of queries, so the answer is true across
every process sharing the store. Functions of a connection.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from dataclasses import dataclass

from .names import VOLUME_PREFIX, pinned_name

CACHED = "cached"
PARTIAL = "partial"


@dataclass(frozen=True)
class ModelState:
    digest: str
    names: tuple[str, ...]
    size: int | None            # bytes of its files (None: not all sizes learned yet)
    missing_blobs: int          # evicted blobs, fetched again on use
    leases: int                 # live leases that are not a daemon's pin
    mounted: int                # of those, the mounted volumes' (names.VOLUME_PREFIX)
    loaded_as: tuple[str, ...]  # names daemons keep it loaded as (their pins)

    @property
    def state(self) -> str:
        return PARTIAL if self.missing_blobs else CACHED

    def as_json(self) -> dict:
        return {"manifest_sha256": self.digest, "names": list(self.names), "size": self.size, "state": self.state,
                "missing_blobs": self.missing_blobs, "leases": self.leases, "mounted": self.mounted,
                "loaded_as": list(self.loaded_as)}


def read_model_states(conn: sqlite3.Connection, now: float) -> list[ModelState]:
    """Every carton, by manifest hash."""
    names: defaultdict[str, list[str]] = defaultdict(list)
    for carton, name in conn.execute("SELECT carton, name FROM names ORDER BY name"):
        names[carton].append(name)
    missing = dict(conn.execute(
        "SELECT e.carton, count(DISTINCT e.digest) FROM entries e LEFT JOIN blobs b ON b.digest=e.digest "
        "WHERE b.digest IS NULL GROUP BY e.carton"))
    leases: defaultdict[str, int] = defaultdict(int)
    mounted: defaultdict[str, int] = defaultdict(int)
    loaded: defaultdict[str, set[str]] = defaultdict(set)
    for carton, lease_id in conn.execute("SELECT carton, id FROM leases WHERE expires_at>?", (now,)):
        name = pinned_name(lease_id)
        if name is None:
            leases[carton] += 1
            mounted[carton] += lease_id.startswith(VOLUME_PREFIX)
        else:
            loaded[carton].add(name)
    return [ModelState(digest, tuple(names[digest]), size, missing.get(digest, 0), leases[digest],
                       mounted[digest],
                       tuple(sorted(loaded[digest])))
            for digest, size in conn.execute("SELECT digest, total_size FROM cartons ORDER BY digest")]
