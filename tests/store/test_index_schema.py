"""The index's schema: version 2's leases table (keyed by id alone, so a
lease's commit writes one page, not three) and the migration of a
version 1 store, which keeps every lease; version 3's figures by kind of
source, which an older store gains at zero."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from cartonstore.store import Store
from cartonstore.store.metadata.index import Index
from cartonstore.store.metadata.schema import SCHEMA_VERSION
from cartonstore.store.metadata.source_bytes import SOURCE_KINDS, SourceBytes

V1_LEASES = """
CREATE TABLE leases (
    id TEXT PRIMARY KEY,
    carton TEXT NOT NULL,
    holder TEXT,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX leases_by_carton ON leases(carton);
"""
ROWS = [("lease-a", "c" * 64, "loader-1", 100.0, 4.0e9),
        ("lease-b", "c" * 64, None, 101.0, 4.1e9),
        ("lease-c", "d" * 64, "loader-2", 102.0, 50.0)]  # expired long ago


def leases_table(db: Path) -> tuple[str, list[str], str]:
    """The leases table's SQL, the indexes on it, and the recorded schema version."""
    conn = sqlite3.connect(db)
    try:
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE type='table' AND name='leases'").fetchone()[0]
        indexes = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='leases' AND sql IS NOT NULL")]
        version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
        return sql, indexes, version
    finally:
        conn.close()


def version_1_store(tmp_path: Path) -> Path:
    """A store as version 1 left it: leases a rowid table indexed by carton, with leases in it."""
    root = tmp_path / "root"
    Store(root).close()
    conn = sqlite3.connect(root / "index.db", isolation_level=None)
    conn.executescript("DROP TABLE leases;" + V1_LEASES)
    with conn:
        conn.executemany("INSERT INTO leases VALUES (?,?,?,?,?)", ROWS)
        conn.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    conn.close()
    sql, indexes, version = leases_table(root / "index.db")
    assert "WITHOUT ROWID" not in sql and indexes == ["leases_by_carton"] and version == "1"
    return root


def test_a_new_store_keys_leases_by_id_alone(tmp_path: Path) -> None:
    root = tmp_path / "root"
    Store(root).close()
    sql, indexes, version = leases_table(root / "index.db")
    assert "WITHOUT ROWID" in sql
    assert indexes == []
    assert version == str(SCHEMA_VERSION) == "3"


def test_a_version_1_store_is_migrated_with_its_leases(tmp_path: Path) -> None:
    root = version_1_store(tmp_path)
    with Store(root) as s:
        assert sorted(s.index._rows("SELECT * FROM leases")) == ROWS
        assert [r.id for r in s.index.live_leases("c" * 64, now=200.0)] == ["lease-a", "lease-b"]
        assert s.index.leased_cartons(200.0) == {"c" * 64}
        renewed = s.index.renew_lease("lease-a", 60.0)
        assert renewed.holder == "loader-1" and renewed.created_at == 100.0
        assert s.index.delete_lease("lease-b")
        assert s.index.expire_leases(200.0) == 1   # lease-c
        assert [r[0] for r in s.index._rows("SELECT id FROM leases")] == ["lease-a"]
    sql, indexes, version = leases_table(root / "index.db")
    assert "WITHOUT ROWID" in sql and indexes == [] and version == str(SCHEMA_VERSION)


def test_the_index_an_older_cartonstore_makes_again_is_dropped(tmp_path: Path) -> None:
    """An older CLI sharing the store creates leases_by_carton when it opens
    it (CREATE INDEX IF NOT EXISTS); the next open by this one drops it, and
    keeps the rows."""
    root = tmp_path / "root"
    with Store(root) as s:
        s.index.create_lease("c" * 64, 60.0, "h", "lease-x")
    conn = sqlite3.connect(root / "index.db")
    with conn:
        conn.execute("CREATE INDEX IF NOT EXISTS leases_by_carton ON leases(carton)")
    conn.close()
    assert leases_table(root / "index.db")[1] == ["leases_by_carton"]
    index = Index(root / "index.db")
    try:
        assert index.lease("lease-x").holder == "h"
    finally:
        index.close()
    assert leases_table(root / "index.db")[1] == []


def test_opening_a_migrated_store_again_changes_nothing(tmp_path: Path) -> None:
    root = version_1_store(tmp_path)
    Store(root).close()
    first = leases_table(root / "index.db")
    Store(root).close()
    assert leases_table(root / "index.db") == first
    with Store(root) as s:
        assert sorted(s.index._rows("SELECT * FROM leases")) == ROWS


def test_a_version_2_store_gains_the_figures_by_kind_of_source_at_zero(tmp_path: Path) -> None:
    """Read before any version 3 opened it for writing (a reader of the
    store's group), its figures are zero; opened for writing, it is
    version 3 and its adds count."""
    root = tmp_path / "root"
    Store(root).close()
    conn = sqlite3.connect(root / "index.db", isolation_level=None)
    conn.execute("DROP TABLE source_bytes")
    conn.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
    conn.close()
    reader = Index(root / "index.db", read_only=True)
    try:
        assert [(f.kind, f.fetched_bytes, f.reused_bytes) for f in reader.source_bytes()] == [
            (kind, 0, 0) for kind in SOURCE_KINDS]
    finally:
        reader.close()
    with Store(root) as s:
        s.index.record_blobs([("a" * 64, 10)], figures=[SourceBytes("oci", 10, 1)])
        assert s.source_bytes()[SOURCE_KINDS.index("oci")] == SourceBytes("oci", 10, 1)
    assert leases_table(root / "index.db")[2] == str(SCHEMA_VERSION)


def test_a_version_1_lease_without_an_id_is_not_carried_over(tmp_path: Path) -> None:
    """A rowid table's TEXT PRIMARY KEY allows NULL, a WITHOUT ROWID key
    does not: copying such a row would fail every open of the store."""
    root = version_1_store(tmp_path)
    conn = sqlite3.connect(root / "index.db")
    with conn:
        conn.execute("INSERT INTO leases VALUES (NULL, ?, NULL, 1.0, 4.0e9)", ("e" * 64,))
    conn.close()
    with Store(root) as s:
        assert sorted(s.index._rows("SELECT * FROM leases")) == ROWS
    assert "WITHOUT ROWID" in leases_table(root / "index.db")[0]


def test_stores_opening_a_version_1_store_at_once_migrate_it_once(tmp_path: Path) -> None:
    """Each open migrates in its own write transaction: the first migrates,
    the others find it migrated (a daemon and CLIs starting together)."""
    import threading

    root = version_1_store(tmp_path)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def open_it() -> None:
        try:
            start.wait()
            Store(root).close()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and not any(t.is_alive() for t in threads)
    sql, indexes, version = leases_table(root / "index.db")
    assert "WITHOUT ROWID" in sql and indexes == [] and version == str(SCHEMA_VERSION)
    with Store(root) as s:
        assert sorted(s.index._rows("SELECT * FROM leases")) == ROWS


@pytest.mark.slow
def test_many_openers_of_one_new_store_all_open_it(tmp_path: Path) -> None:
    """Eight openers of one new index at once, 150 times: every one opens it
    in WAL mode. SQLite answers the loser of the race to switch the journal
    mode "database is locked" at once, busy_timeout or not (six `cartonstore
    add`s on a new store failed so, about once in 20 tries of eight)."""
    failures: list[BaseException] = []
    for round_ in range(150):
        path = tmp_path / f"r{round_}" / "index.db"
        path.parent.mkdir()
        start = threading.Barrier(8)

        def open_it(path: Path = path, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                index = Index(path)
                assert index.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
                index.close()
            except BaseException as e:  # noqa: BLE001 - collected, asserted below
                failures.append(e)

        threads = [threading.Thread(target=open_it) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []

