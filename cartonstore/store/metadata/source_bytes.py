"""The index's source_bytes table: per kind of source, the bytes its adds
brought into the store (fetched) and the bytes they wanted and found
already stored, so did not fetch (reused), with the blobs of each.

A commit adds its figures in the transaction that records its blobs, so
the figures are the store's: every process adding to it (the daemon, CLI
commands) counts into the same rows, and a commit that fails counts
nothing. Functions of a connection, run inside the caller's transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

SOURCE_KINDS = ("url", "oci", "hf", "peer", "mirror", "adopted")
"""The kinds, as ``ls --sources`` and /metrics name them:

- ``url``: a carton's zip at an http(s) URL, and the LINKS URLs of its blobs;
- ``oci``: an OCI registry's blobs (a carton artifact, or model files);
- ``hf``: a Hugging Face repository's files (``hf://``);
- ``peer``: another node's store (fetch/sources/peers.py);
- ``mirror``: a ``[fetch] mirrors`` URL or a registry's mirror;
- ``adopted``: files taken in where they are (``cartonstore adopt``):
  fetched counts what was linked or copied in.
"""


@dataclass(frozen=True)
class SourceBytes:
    """One kind's figures: what one commit adds, or the store's totals."""

    kind: str
    fetched_bytes: int = 0
    fetched_blobs: int = 0
    reused_bytes: int = 0
    reused_blobs: int = 0

    @property
    def hit_ratio(self) -> float | None:
        """Of the bytes this kind's adds wanted, the share the store already
        had; None while they wanted none."""
        wanted = self.reused_bytes + self.fetched_bytes
        return self.reused_bytes / wanted if wanted else None

    def as_json(self) -> dict[str, int]:
        return {"fetched_bytes": self.fetched_bytes, "fetched_blobs": self.fetched_blobs,
                "reused_bytes": self.reused_bytes, "reused_blobs": self.reused_blobs}


def add_source_bytes(conn: sqlite3.Connection, figures: Iterable[SourceBytes]) -> None:
    conn.executemany(
        "INSERT INTO source_bytes VALUES (?,?,?,?,?) ON CONFLICT(kind) DO UPDATE SET "
        "fetched_bytes=fetched_bytes+excluded.fetched_bytes, fetched_blobs=fetched_blobs+excluded.fetched_blobs, "
        "reused_bytes=reused_bytes+excluded.reused_bytes, reused_blobs=reused_blobs+excluded.reused_blobs",
        [(f.kind, f.fetched_bytes, f.fetched_blobs, f.reused_bytes, f.reused_blobs) for f in figures
         if f.fetched_blobs or f.reused_blobs])


def read_source_bytes(conn: sqlite3.Connection) -> list[SourceBytes]:
    """Every kind of SOURCE_KINDS (zero where nothing came from it), then
    any other kind recorded. A store no version with this table has
    written yet, opened read-only, has none: zeros."""
    try:
        rows = conn.execute("SELECT kind, fetched_bytes, fetched_blobs, reused_bytes, reused_blobs "
                            "FROM source_bytes ORDER BY kind").fetchall()
    except sqlite3.OperationalError as e:
        if "no such table" not in str(e):
            raise
        rows = []
    recorded = {row[0]: SourceBytes(*row) for row in rows}
    return [recorded.pop(kind, SourceBytes(kind)) for kind in SOURCE_KINDS] + list(recorded.values())
