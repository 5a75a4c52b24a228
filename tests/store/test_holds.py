"""A carton being completed or materialized is held against eviction: a
collection under its size budget may run at any moment, and must not take
the blobs just restored before the carton is whole or its directory built."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from kit.daemonkit import wait_for_async
from kit.fetchkit import URLS_ONLY, fast_config
from kit.prockit import descriptors_of
from test_gc import _carton

from cartonstore.fetch.holds import holding
from cartonstore.fetch.puller import Puller
from cartonstore.store import Store
from cartonstore.store.gc.plan import GcPolicy


def _weights(store: Store, digest: str) -> list[str]:
    return [e.digest for e in store.index.entries(digest) if e.path.startswith("model/")]


def test_a_held_carton_keeps_its_blobs_through_a_collection(store: Store, tmp_path: Path) -> None:
    d = store.add(_carton(tmp_path, "held", {"model/w": b"w" * 50_000})).digest

    async def collect_while_held() -> object:
        async with holding(store, d, "test"):
            assert store.index.count_live_leases() == 1
            return await asyncio.to_thread(store.collect, GcPolicy(max_size=0, grace=0))

    report = asyncio.run(collect_while_held())
    assert report.evicted_blobs == 0 and all(store.blobs.has(w) for w in _weights(store, d))
    assert store.index.count_live_leases() == 0, "the hold is dropped after the block"
    assert store.collect(GcPolicy(max_size=0, grace=0)).evicted_blobs == 1


@pytest.mark.slow
def test_completing_under_a_collection_that_never_stops_ends_complete(store: Store, tmp_path: Path) -> None:
    """Blobs come back from the local file while a collection with a zero
    budget runs in a loop: without the hold, it evicts them again before the
    last check and the add fails with 'missing blob(s) with no known source'."""
    files = {f"model/w{i}": bytes([i]) * 20_000 for i in range(40)}
    source = _carton(tmp_path, "busy", files)
    d = store.add(source).digest
    stop = threading.Event()
    collections = [0]

    def collect_forever() -> None:
        with Store(store.root) as other:  # another process's view: its own connection and locks
            while not stop.is_set():
                other.collect(GcPolicy(max_size=0, grace=0))
                collections[0] += 1

    collector = threading.Thread(target=collect_forever)
    collector.start()
    try:
        async def add_and_materialize() -> Path:
            async with Puller(store, fast_config(), sources=URLS_ONLY) as p:
                for _ in range(60):
                    r = await p.add(str(source))
                    assert r.digest == d
                return await p.materialize(d)

        model = asyncio.run(add_and_materialize())
    finally:
        stop.set()
        collector.join(30)
    assert collections[0] > 0
    # Returned once built; unleased, the next collection may take it away at once.
    assert model == store.layout.model_path(d)
    assert store.index.count_live_leases() == 0


HOLD_THEN_SLEEP = """
import asyncio, sys
from cartonstore.fetch.holds import holding
from cartonstore.store import Store

async def main():
    with Store(sys.argv[1]) as store:
        async with holding(store, sys.argv[2], "test"):
            print("held", flush=True)
            await asyncio.sleep(600)

asyncio.run(main())
"""


def _leased_then_killed(store: Store, digest: str, script: str, said: str,
                        while_live: Callable[[], None] = lambda: None) -> None:
    """A process runs ``script`` (leasing digest, then saying ``said``); the
    store sees its leases live (``while_live`` checks more), then SIGKILL."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", script, str(store.root), digest], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == said
        while_live()
        # while its process lives, a hold or a pin is a lease like any other
        store.collect(GcPolicy(max_size=0, grace=0))
        assert all(store.blobs.has(w) for w in _weights(store, digest))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()


def _held_then_killed(store: Store, digest: str) -> None:
    """A process holds digest, the store sees it live, then SIGKILL."""
    def held_by_it() -> None:
        assert store.index.live_leases(digest)[0].holder.startswith("cartonstore test (pid")

    _leased_then_killed(store, digest, HOLD_THEN_SLEEP, "held", held_by_it)


def test_the_hold_of_a_killed_process_blocks_neither_rm_nor_gc(store: Store, tmp_path: Path) -> None:
    a, b = (_carton(tmp_path, n, {"model/w": n.encode() * 5000}) for n in ("a", "b"))
    _held_then_killed(store, store.add(a).digest)
    store.remove(store.add(a).digest)  # its dead hold is dropped, not a Conflict
    digest = store.add(b).digest
    _held_then_killed(store, digest)
    report = store.collect(GcPolicy(max_size=0, grace=0))
    assert report.expired_leases == 1 and not store.blobs.has(_weights(store, digest)[0])
    assert store.index.count_live_leases() == 0


def test_a_request_cancelled_while_its_hold_is_taken_leaves_no_hold(store: Store, tmp_path: Path) -> None:
    """A client gone while the daemon takes the hold: the worker thread
    takes it anyway, and it must be dropped, not left for 5 minutes."""
    d = store.add(_carton(tmp_path, "gone", {"model/w": b"w" * 1000})).digest

    async def cancelled_then_settle() -> None:
        async def hold() -> None:
            async with holding(store, d, "test"):
                await asyncio.sleep(60)

        lock_file = store.lock().path.resolve()
        with store.lock():  # the hold's thread waits on the shared lock: cancel it meanwhile
            mine = descriptors_of(os.getpid(), lock_file)
            task = asyncio.ensure_future(hold())
            assert await wait_for_async(lambda: descriptors_of(os.getpid(), lock_file) > mine)
            task.cancel()
            assert await wait_for_async(task.done)
        assert await wait_for_async(lambda: store.index.count_live_leases() == 0)
        await asyncio.sleep(0.2)   # nothing to wait for: the time a hold taken late would take to show

    asyncio.run(cancelled_then_settle())
    assert store.index.count_live_leases() == 0


PIN_THEN_SLEEP = """
import sys, time
from cartonstore.store import Store
from cartonstore.store.metadata.names import PIN_PREFIX, SWITCH_PREFIX
from cartonstore.store.root.owner import owner_token

with Store(sys.argv[1]) as store:
    owner = owner_token(store.layout.tmp_dir)   # a daemon's pins are named by its owner token
    for prefix in (PIN_PREFIX, SWITCH_PREFIX):
        store.index.create_lease(sys.argv[2], 600, holder="loaded:m", lease_id=f"{prefix}{owner}:m")
    print("pinned", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("then", ["rm", "gc"])
def test_the_pins_of_a_killed_daemon_block_neither_rm_nor_gc(store: Store, tmp_path: Path, then: str) -> None:
    """A SIGKILLed daemon's pin and switch lease (pin:<owner>:<name>) hold
    its carton while it lives, and go with the next rm or gc once its owner
    lock is free, without waiting for a daemon to start or the pins to expire."""
    from cartonstore.errors import Conflict

    digest = store.add(_carton(tmp_path, "p", {"model/w": b"p" * 5000})).digest

    def loaded_by_it() -> None:
        with pytest.raises(Conflict, match="is loaded as m by the daemon: unload it first: cartonstore unload m"):
            store.remove(digest)

    _leased_then_killed(store, digest, PIN_THEN_SLEEP, "pinned", loaded_by_it)
    if then == "rm":
        store.remove(digest)
    else:
        report = store.collect(GcPolicy(max_size=0, grace=0))
        assert report.expired_leases == 2 and not store.blobs.has(_weights(store, digest)[0])
    assert store.index.count_live_leases() == 0


def test_a_pin_from_before_daemons_named_theirs_still_reads_as_loaded(store: Store, tmp_path: Path) -> None:
    """pin:<name>, as a daemon before owner tokens wrote it: it has no owner
    to sweep it by, and until it expires it is a loaded model's pin."""
    from cartonstore.errors import Conflict

    digest = store.add(_carton(tmp_path, "old", {"model/w": b"o" * 5000}), name="old").digest
    store.index.create_lease(digest, 600, holder="loaded:old", lease_id="pin:old")
    with pytest.raises(Conflict, match="is loaded as old by the daemon"):
        store.remove(digest)
    store.collect(GcPolicy(max_size=0, grace=0))
    assert all(store.blobs.has(w) for w in _weights(store, digest))
    other = store.add(_carton(tmp_path, "new", {"model/w": b"n" * 5000})).digest
    with pytest.raises(Conflict, match="name old is loaded by the daemon as version"):
        store.name_carton(other, "old")
