"""The daemon's two ways of writing a lease: on the loop when nothing is in
the way (ImmediateWriter, HeldLock.try_acquire), on its database thread when
another process holds SQLite's write lock or gc holds the store lock. Real
SQLite files, real flocks, a real daemon process."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST
from kit.daemonkit import DaemonProcess, unix_session, wait_for_async

from cartonstore.cli.commands import main
from cartonstore.errors import NotFound
from cartonstore.store import Store
from cartonstore.store.metadata.sqlite_ops import WOULD_WAIT, ImmediateWriter
from cartonstore.store.root.locks import HeldLock


def lease_count(root: Path) -> int:
    conn = sqlite3.connect(root / "index.db")
    try:
        return conn.execute("SELECT count(*) FROM leases").fetchone()[0]
    finally:
        conn.close()


def test_immediate_writer_runs_a_group_in_one_transaction(store: Store) -> None:
    writer = ImmediateWriter(store.layout.index_db)

    def insert(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO leases VALUES ('a', 'c', NULL, 0, 1)")
        return "inserted"

    def refuse(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO leases VALUES ('b', 'c', NULL, 0, 1)")
        raise NotFound("no such thing")

    results = writer.try_run([insert, refuse])
    assert results[0] == "inserted" and isinstance(results[1], NotFound)
    assert lease_count(store.root) == 2, "an operation's error keeps the writes made before it, as run_batch does"
    writer.close()


def test_immediate_writer_never_waits_and_leaves_nothing_when_busy(store: Store) -> None:
    writer = ImmediateWriter(store.layout.index_db)
    other = sqlite3.connect(store.layout.index_db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    ran = []
    t0 = time.monotonic()
    assert writer.try_run([lambda conn: ran.append(conn)]) is WOULD_WAIT
    assert time.monotonic() - t0 < 0.5 and ran == [], "busy: refused at once, the operation never ran"
    other.execute("ROLLBACK")
    assert writer.try_run([lambda conn: conn.execute("INSERT INTO leases VALUES ('a','c',NULL,0,1)")]) != WOULD_WAIT
    assert lease_count(store.root) == 1
    other.close()
    writer.close()


def test_immediate_writer_rolls_back_a_bug_and_raises_it(store: Store) -> None:
    writer = ImmediateWriter(store.layout.index_db)

    def buggy(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO leases VALUES ('a','c',NULL,0,1)")
        raise KeyError("bug")

    with pytest.raises(KeyError):
        writer.try_run([buggy])
    assert lease_count(store.root) == 0
    assert writer.try_run([lambda conn: 1]) == [1], "the connection is usable after the rollback"
    writer.close()


def test_immediate_writer_says_when_a_checkpoint_is_due(store: Store, monkeypatch) -> None:
    monkeypatch.setattr(ImmediateWriter, "CHECKPOINT_EVERY", 3)
    writer = ImmediateWriter(store.layout.index_db)
    for _ in range(3):
        assert not writer.checkpoint_due
        writer.try_run([lambda conn: conn.execute("UPDATE meta SET value=value")])
    assert writer.checkpoint_due
    store.index.checkpoint()
    writer.checkpointed()
    assert not writer.checkpoint_due
    writer.close()


def test_held_lock_try_acquire_never_waits(store: Store) -> None:
    shared = HeldLock(store.lock(shared=True))
    with store.lock():
        t0 = time.monotonic()
        assert not shared.try_acquire()
        assert time.monotonic() - t0 < 0.5
    assert shared.try_acquire()
    other = HeldLock(store.lock(shared=True))
    assert other.try_acquire(), "shared holders do not exclude each other"
    other.release()
    shared.release()
    shared.close()
    other.close()


@pytest.fixture
def served(daemon: DaemonProcess, capsys) -> DaemonProcess:
    assert main(["add", str(FIXTURE_CARTON), "--name", "fx", "--root", str(daemon.root), "--progress", "none"]) == 0
    capsys.readouterr()
    return daemon


async def _take(sock: Path, model: str = "fx") -> tuple[int, dict, float]:
    async with unix_session(sock) as s:
        t0 = time.monotonic()
        async with s.post("/v1/leases", json={"model": model, "ttl": 30}) as r:
            return r.status, await r.json(), time.monotonic() - t0


def _hold_in_background(enter, leave, seconds: float) -> threading.Thread:
    held = threading.Event()

    def run() -> None:
        enter()
        held.set()
        time.sleep(seconds)
        leave()

    t = threading.Thread(target=run)
    t.start()
    held.wait(5)
    return t


def test_a_lease_waits_for_another_processes_sqlite_writer(served: DaemonProcess) -> None:
    asyncio.run(_take(served.socket_path))  # materialized: the next lease is a cached one
    other = sqlite3.connect(served.root / "index.db", isolation_level=None, check_same_thread=False)
    t = _hold_in_background(lambda: other.execute("BEGIN IMMEDIATE"), lambda: other.execute("COMMIT"), 0.6)
    status, lease, took = asyncio.run(_take(served.socket_path))
    t.join()
    other.close()
    assert status == 200 and lease["manifest_sha256"] == FIXTURE_DIGEST
    assert took >= 0.4, "it waited for the other writer rather than failing or skipping the row"
    assert lease_count(served.root) == 2


def test_a_lease_waits_for_a_collection_turn(served: DaemonProcess) -> None:
    asyncio.run(_take(served.socket_path))
    with Store(served.root) as store:
        lock = store.lock()
        t = _hold_in_background(lock.acquire, lock.release, 0.6)
        status, _lease, took = asyncio.run(_take(served.socket_path))
        t.join()
    assert status == 200 and took >= 0.4 and lease_count(served.root) == 2


def test_errors_come_back_the_same_either_way(served: DaemonProcess) -> None:
    async def release(lease: str) -> tuple[int, dict]:
        async with unix_session(served.socket_path) as s, s.delete(f"/v1/leases/{lease}") as r:
            return r.status, await r.json()

    fast = asyncio.run(release("nope"))
    other = sqlite3.connect(served.root / "index.db", isolation_level=None, check_same_thread=False)
    t = _hold_in_background(lambda: other.execute("BEGIN IMMEDIATE"), lambda: other.execute("COMMIT"), 0.3)
    slow = asyncio.run(release("nope"))
    t.join()
    other.close()
    assert fast == slow and fast[0] == 404 and "no lease 'nope'" in fast[1]["error"]


@pytest.mark.slow
def test_the_wal_is_checkpointed_while_leases_are_written_on_the_loop(served: DaemonProcess) -> None:
    async def churn(n: int) -> None:
        async with unix_session(served.socket_path) as s:
            async def one() -> None:
                for _ in range(n):
                    async with s.post("/v1/leases", data=json.dumps({"model": "fx", "ttl": 30})) as r:
                        lease = (await r.json())["lease"]
                    async with s.delete(f"/v1/leases/{lease}") as r:
                        assert r.status == 200

            await asyncio.gather(*(one() for _ in range(4)))

    asyncio.run(churn(1500))  # 12,000 requests, each a commit when they come one by one
    wal = served.root / "index.db-wal"
    # Unchecked, 12,000 commits of 3-4 pages would make a WAL of 150-200 MiB;
    # checkpoints every 1,000 commits let it start over at about 16 MiB.
    assert wal.stat().st_size < 40 * 2**20, f"WAL grew to {wal.stat().st_size} bytes: never checkpointed?"
    assert lease_count(served.root) == 0


def slowed(monkeypatch, store: Store, method: str, seconds: float) -> threading.Event:
    """Make the index's ``method`` take ``seconds`` longer (in its thread);
    the event is set when a call starts."""
    started = threading.Event()
    real = getattr(type(store.index), method)

    def slow(index) -> None:
        started.set()
        time.sleep(seconds)
        real(index)

    monkeypatch.setattr(type(store.index), method, slow)
    return started


def insert(lease_id: str):  # noqa: ANN201 - a group-commit operation
    return lambda conn: conn.execute("INSERT INTO leases VALUES (?, 'c', NULL, 0, 1)", (lease_id,)).rowcount


def test_leases_are_written_on_the_loop_while_the_wal_is_synced(store: Store, monkeypatch) -> None:
    """A checkpoint's long part, the WAL's fsync, runs while the loop goes on
    writing leases the fast way; only the checkpoint proper makes them wait.
    The sync is slowed (0.5 s) to make the window wide enough to write in."""
    from cartonstore.store.group_commit import GroupCommit

    monkeypatch.setattr(ImmediateWriter, "CHECKPOINT_EVERY", 2)
    syncing = slowed(monkeypatch, store, "sync_wal", 0.5)

    async def scenario() -> float:
        group = GroupCommit(store)
        try:
            for n in range(2):
                assert await group.run(insert(f"before-{n}")) == 1
            await asyncio.sleep(0)  # the checkpoint task starts its sync
            assert await asyncio.to_thread(syncing.wait, 5)
            t0 = time.monotonic()
            assert await group.run(insert("during")) == 1
            took = time.monotonic() - t0
            assert await wait_for_async(lambda: group._checkpoint_task is None)  # the checkpoint ends
            assert not group._immediate.checkpoint_due
            return took
        finally:
            await group.close()

    took = asyncio.run(scenario())
    assert took < 0.25, f"a lease waited {took:.2f} s for the WAL's sync"
    assert lease_count(store.root) == 3



def test_leases_written_during_the_checkpoint_proper_wait_for_it_then_commit(store: Store, monkeypatch) -> None:
    """While the checkpoint proper runs (slowed to 0.4 s here), writes wait
    for it, none is lost, and they commit the fast way once it ends: the WAL
    can then start over."""
    from cartonstore.store.group_commit import GroupCommit

    monkeypatch.setattr(ImmediateWriter, "CHECKPOINT_EVERY", 1)
    checkpointing = slowed(monkeypatch, store, "checkpoint", 0.4)

    async def scenario() -> list[float]:
        group = GroupCommit(store)
        try:
            assert await group.run(insert("first")) == 1  # makes a checkpoint due
            assert await asyncio.to_thread(checkpointing.wait, 5)
            t0 = time.monotonic()
            results = await asyncio.gather(*(group.run(insert(f"during-{n}")) for n in range(5)))
            assert results == [1] * 5
            return [time.monotonic() - t0, group._immediate._commits]  # 1: one batch, on the loop
        finally:
            await group.close()

    waited, loop_commits = asyncio.run(scenario())
    assert 0.1 < waited < 5, f"the writes took {waited:.2f} s: they should wait for the checkpoint, and only that long"
    assert loop_commits == 1, "the five waiting writes should commit together, on the loop"
    assert lease_count(store.root) == 6


def test_a_failing_checkpoint_is_tried_again_after_as_many_commits_not_at_each_write(store: Store,
                                                                                       monkeypatch) -> None:
    """A checkpoint that fails (the WAL cannot be synced) is logged, and the
    next is due only after CHECKPOINT_EVERY more commits; writes go on."""
    from cartonstore.errors import Unavailable
    from cartonstore.store.group_commit import GroupCommit

    monkeypatch.setattr(ImmediateWriter, "CHECKPOINT_EVERY", 5)
    attempts = []

    def failing(_index) -> None:
        attempts.append(1)
        raise Unavailable("cannot sync the WAL: injected")

    monkeypatch.setattr(type(store.index), "sync_wal", failing)

    async def scenario() -> None:
        group = GroupCommit(store)
        try:
            for n in range(100):
                assert await group.run(insert(f"l{n}")) == 1
                await asyncio.sleep(0)   # the checkpoint task, when one is due, runs
            assert await wait_for_async(lambda: group._checkpoint_task is None)
        finally:
            await group.close()

    asyncio.run(scenario())
    assert 1 <= len(attempts) <= 100 // 5 + 1, len(attempts)
    assert lease_count(store.root) == 100


def test_close_lets_a_checkpoint_end_and_the_writes_waiting_for_it_commit(store: Store, monkeypatch) -> None:
    """Shutting down while the checkpoint proper runs: it ends, and the
    writes that waited for it commit before the thread, the locks and the
    connection go (before, close() let go of them under the checkpoint, and
    the waiting writes were never answered)."""
    from cartonstore.store.group_commit import GroupCommit

    monkeypatch.setattr(ImmediateWriter, "CHECKPOINT_EVERY", 1)
    checkpointing = slowed(monkeypatch, store, "checkpoint", 0.3)

    async def scenario() -> list:
        group = GroupCommit(store)
        assert await group.run(insert("first")) == 1
        assert await asyncio.to_thread(checkpointing.wait, 5)
        waiting = [asyncio.ensure_future(group.run(insert(f"w{n}"))) for n in range(3)]
        await asyncio.sleep(0)   # one turn of the loop: each write runs to its first await, queued
        await group.close()
        return await asyncio.gather(*waiting, return_exceptions=True)

    assert asyncio.run(scenario()) == [1, 1, 1]
    assert lease_count(store.root) == 4

