"""The index's tables (ROOT/index.db). Created if missing; SCHEMA_VERSION
is recorded in meta. Version 2: leases is a WITHOUT ROWID table with no
index by carton (migrate_leases). Version 3: source_bytes, the bytes
fetched and reused by kind of source (source_bytes.py; migrate_source_bytes).
loaded_models (the models a daemon, known by its socket path, had loaded:
loaded_rows.py) and adopted_blobs (blobs that share their inode with a file
another tool keeps: adopted_rows.py) came later, tables an older cartonstore
leaves alone; an adopted blob's row goes with its blob row (ON DELETE
CASCADE), whoever deletes that."""

import sqlite3

SCHEMA_VERSION = 3

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (
    digest TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    added_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS cartons (
    digest TEXT PRIMARY KEY,
    model_name TEXT,
    runner_name TEXT,
    file_count INTEGER NOT NULL,
    total_size INTEGER,
    source TEXT,
    added_at REAL NOT NULL,
    last_used REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS cartons_by_added_at ON cartons(added_at);
CREATE TABLE IF NOT EXISTS entries (
    carton TEXT NOT NULL REFERENCES cartons(digest) ON DELETE CASCADE,
    path TEXT NOT NULL,
    digest TEXT NOT NULL,
    size INTEGER,
    kind TEXT NOT NULL DEFAULT 'file',
    target TEXT,
    PRIMARY KEY (carton, path)
);
CREATE INDEX IF NOT EXISTS entries_by_digest ON entries(digest);
CREATE TABLE IF NOT EXISTS names (
    name TEXT PRIMARY KEY,
    carton TEXT NOT NULL REFERENCES cartons(digest) ON DELETE CASCADE,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS names_by_carton ON names(carton);
CREATE TABLE IF NOT EXISTS links (
    digest TEXT NOT NULL,
    url TEXT NOT NULL,
    position INTEGER NOT NULL,
    PRIMARY KEY (digest, url)
);
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY,
    carton TEXT NOT NULL,
    holder TEXT,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS loaded_models (
    daemon TEXT NOT NULL,
    name TEXT NOT NULL,
    carton TEXT NOT NULL,
    config TEXT,
    loaded_at REAL NOT NULL,
    PRIMARY KEY (daemon, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS local_sources (
    digest TEXT NOT NULL,
    path TEXT NOT NULL,
    member TEXT NOT NULL,
    file_size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    header_offset INTEGER,
    compressed_size INTEGER,
    method INTEGER,
    added_at REAL NOT NULL,
    PRIMARY KEY (digest, path, member)
);
CREATE TABLE IF NOT EXISTS source_bytes (
    kind TEXT PRIMARY KEY,
    fetched_bytes INTEGER NOT NULL,
    fetched_blobs INTEGER NOT NULL,
    reused_bytes INTEGER NOT NULL,
    reused_blobs INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS adopted_blobs (
    digest TEXT PRIMARY KEY REFERENCES blobs(digest) ON DELETE CASCADE,
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    dev INTEGER NOT NULL,
    added_at REAL NOT NULL
);
"""

# Why leases changed (version 2): a lease and its release are the daemon's
# most frequent writes, each its own small commit, and every page a commit
# touches is a whole page in the WAL that the next checkpoint syncs. As a
# rowid table with two indexes (its id, its carton) a commit touched about
# three pages; keyed by id alone, one. Closed loop, 64 clients: 70 -> 49 us
# per commit, and each checkpoint's WAL sync 16 -> 10 ms. Looking leases up
# by carton (removing a carton, gc's leased set) scans the table instead:
# it holds the live leases only, and those lookups are rare.
_LEASES_V2 = """
CREATE TABLE leases_v2 (
    id TEXT PRIMARY KEY,
    carton TEXT NOT NULL,
    holder TEXT,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID
"""


def migrate_leases(conn: sqlite3.Connection) -> None:
    """In the caller's write transaction: leases as version 2 has it, from a
    version 1 store (rows kept), and without the index by carton that an
    older cartonstore sharing the store creates again when it opens it."""
    conn.execute("DROP INDEX IF EXISTS leases_by_carton")
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE type='table' AND name='leases'").fetchone()[0]
    if "WITHOUT ROWID" in sql.upper():
        return
    conn.execute("DROP TABLE IF EXISTS leases_v2")
    conn.execute(_LEASES_V2)
    # A NULL id (a rowid table's TEXT PRIMARY KEY allows one; nothing of ours
    # wrote it) can be neither released nor renewed, and a key of WITHOUT
    # ROWID may not be NULL: copying it would fail every open of the store.
    conn.execute("INSERT INTO leases_v2 SELECT id, carton, holder, created_at, expires_at FROM leases "
                 "WHERE id IS NOT NULL")
    conn.execute("DROP TABLE leases")
    conn.execute("ALTER TABLE leases_v2 RENAME TO leases")


def migrate_source_bytes(conn: sqlite3.Connection) -> None:
    """In the caller's write transaction, after SCHEMA ran (which creates
    source_bytes where it is missing): a store of an older version starts
    its figures at zero, from its next add; its version becomes 3. An older
    cartonstore sharing the store leaves the table alone, and its adds go
    uncounted."""
    conn.execute("UPDATE meta SET value=? WHERE key='schema_version' AND CAST(value AS INTEGER) < ?",
                 (str(SCHEMA_VERSION), SCHEMA_VERSION))
