"""The index's tables (ROOT/index.db). Created if missing; SCHEMA_VERSION
is recorded in meta for the day a migration is needed."""

SCHEMA_VERSION = 1

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
);
CREATE INDEX IF NOT EXISTS leases_by_carton ON leases(carton);
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
"""
