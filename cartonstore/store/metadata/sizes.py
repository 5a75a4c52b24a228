"""Sizes the index learns late: a file listed only in LINKS has no size
until its blob arrives (LINKS v1 carries URLs, not sizes). When a blob is
recorded, every entry that lists it takes its size, and every carton whose
files are then all sized takes its total, in the transaction that records
the blob, so ``ls`` and ``inspect`` never show a complete carton as
size-less.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

# A carton's total is the sum of its files (a file listed at two paths
# counts twice, a symlink not at all), as commit_carton computes it.
_TOTAL = ("(SELECT coalesce(sum(size), 0) FROM entries WHERE entries.carton=cartons.digest "
          "AND kind='file')")
_ALL_SIZED = ("NOT EXISTS (SELECT 1 FROM entries WHERE entries.carton=cartons.digest "
              "AND kind='file' AND size IS NULL)")


def learn_sizes(conn: sqlite3.Connection, digests: Iterable[str]) -> None:
    """Entries listing these blobs take the size the blobs table records;
    cartons listing them whose every file is sized now take their total."""
    rows = [(d,) for d in set(digests)]
    if not rows:
        return
    conn.executemany("UPDATE entries SET size=(SELECT size FROM blobs WHERE blobs.digest=entries.digest) "
                     "WHERE digest=? AND size IS NULL AND kind='file'", rows)
    conn.executemany(f"UPDATE cartons SET total_size={_TOTAL} WHERE total_size IS NULL "
                     f"AND digest IN (SELECT carton FROM entries WHERE digest=?) AND {_ALL_SIZED}", rows)


def learn_all_sizes(conn: sqlite3.Connection) -> None:
    """The same for the whole index (once, for stores written before sizes
    were learned)."""
    conn.execute("UPDATE entries SET size=(SELECT size FROM blobs WHERE blobs.digest=entries.digest) "
                 "WHERE size IS NULL AND kind='file'")
    conn.execute(f"UPDATE cartons SET total_size={_TOTAL} WHERE total_size IS NULL AND {_ALL_SIZED}")
