"""Group commit for the daemon's small index writes (leases, pins).

Every operation queued while the loop is busy shares one transaction. The
group runs right on the loop when that needs no wait (the shared store lock
and SQLite's write lock both free: tried, never waited for); otherwise on
the daemon's one database thread, which waits as long as it must while the
loop goes on. While the checkpoint proper runs (a few ms, see _checkpoint),
groups wait for it and then run on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from cartonstore.errors import CartonStoreError, Unavailable
from cartonstore.store.metadata.sqlite_ops import WOULD_WAIT, ImmediateWriter
from cartonstore.store.root.locks import HeldLock

from . import Store

log = logging.getLogger("cartonstore.server")
T = TypeVar("T")

WAL_SYNC_ROUNDS = 3      # WAL syncs at most before a checkpoint...
WAL_SYNC_SHORT = 0.005   # ...stopping after one this quick: what is left is a few commits


class GroupCommit:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cartonstore-db")
        self._queue: list[tuple[Any, asyncio.Future]] = []
        self._draining = False        # a flush is scheduled, waits for a checkpoint, or is draining
        self._deferred = False        # a flush waits for the checkpoint proper, which runs it when it ends
        self._shared_store_lock = HeldLock(store.lock(shared=True))
        # The fast way for the same operations, on the loop itself (see run).
        self._immediate = ImmediateWriter(store.layout.index_db)
        self._immediate_store_lock = HeldLock(store.lock(shared=True))  # its own fd: flocks belong to one
        self._checkpointing = False   # the checkpoint proper runs: writes queue behind it
        self._checkpoint_task: asyncio.Task[None] | None = None   # from the WAL's sync until the checkpoint is done
        self._drain_task: asyncio.Future[None] | None = None

    async def run(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run a small index operation (a few rows, a stat) in a group
        commit: every operation queued meanwhile shares one transaction.

        The group runs right here on the loop when that needs no wait: the
        shared store lock and SQLite's write lock are both free (tried, never
        waited for); one commit then costs less than the two thread hops it
        spares. Otherwise it goes to the database thread, which waits as
        long as it must while the loop goes on."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.append((op, fut))
        if not self._draining:
            self._draining = True
            loop.call_soon(self._flush)  # after every handler ready to run has queued its operation
        result = await fut
        if isinstance(result, CartonStoreError):
            raise result
        return result

    def _flush(self) -> None:
        if self._checkpointing:
            # Writes wait for the checkpoint proper (a few ms; _checkpoint
            # flushes them when it ends): a checkpoint that writers keep
            # overtaking never lets the WAL restart from its beginning, and
            # the file grows without end.
            self._deferred = True
            return
        if not self._queue:
            self._draining = False
            return
        batch, self._queue = self._queue, []
        results: object = WOULD_WAIT
        if self._immediate_store_lock.try_acquire():
            try:
                results = self._immediate.try_run([op for op, _ in batch])
            except Exception as e:  # noqa: BLE001 - a bug: handed to every waiter
                results = [e] * len(batch)
            finally:
                self._immediate_store_lock.release()
        if results is WOULD_WAIT:
            self._queue = batch + self._queue
            self._drain_task = asyncio.ensure_future(self._drain())   # held: the loop keeps only weak references
            return
        self._draining = False
        _deliver(batch, results)  # type: ignore[arg-type]  # not WOULD_WAIT: the results
        if self._immediate.checkpoint_due and self._checkpoint_task is None:
            self._checkpoint_task = asyncio.ensure_future(self._checkpoint())

    async def _drain(self) -> None:
        """The patient way: batches on the database thread until none is left."""
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    results = await loop.run_in_executor(self._db_thread, self._run_ops, [op for op, _ in batch])
                except BaseException as e:  # noqa: BLE001 - handed to every waiter
                    results = [e] * len(batch)
                _deliver(batch, results)
        finally:
            self._draining = False

    async def _checkpoint(self) -> None:
        """The WAL the loop's writes grew, copied back off the loop.

        Most of a checkpoint's time is the fsync of the WAL: its commits were
        written unsynced (synchronous=NORMAL), 250 of them make megabytes,
        and syncing them took 25-35 ms here, during which every lease waited.
        So the WAL is synced first, again while a sync takes long (what came
        during one is synced by the next), while the loop's writes go on; the
        checkpoint proper, which writes wait for, then syncs only the last
        few commits: a few ms. The writes that came meanwhile run as one
        group when it ends."""
        try:
            for _ in range(WAL_SYNC_ROUNDS):  # what was written during one sync is synced by the next, quicker one
                started = time.monotonic()
                await self.on_db_thread(self.store.index.sync_wal)
                if time.monotonic() - started < WAL_SYNC_SHORT:
                    break
            self._checkpointing = True
            await self.on_db_thread(self.store.index.checkpoint)
        except CartonStoreError as e:
            log.warning("checkpoint of the index failed: %s", e)
        except Exception:  # a bug must not stop the next checkpoints
            log.exception("checkpoint of the index failed")
        finally:
            # Failed or not, the next one is due after as many commits again, not at the next write.
            self._immediate.checkpointed()
            self._checkpointing = False
            self._checkpoint_task = None
            if self._deferred:  # the writes that waited for the checkpoint proper
                self._deferred = False
                self._flush()

    def _run_ops(self, ops: list) -> list:
        with self._shared_store_lock:  # a collection sees all of these leases or none
            return self.store.index.run_batch(ops)

    async def on_db_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Index work on the daemon's one database thread: SQLite serializes
        writers anyway, and one thread spares the hand-offs between many."""
        return await asyncio.get_running_loop().run_in_executor(self._db_thread, fn, *args)

    async def close(self) -> None:
        """Let a checkpoint under way end, answer what is still queued as
        refused, then let go of the thread, the locks and the connection."""
        if self._checkpoint_task is not None:
            await asyncio.gather(self._checkpoint_task, return_exceptions=True)
        batch, self._queue = self._queue, []
        _deliver(batch, [Unavailable("the daemon is shutting down")] * len(batch))
        await asyncio.get_running_loop().run_in_executor(None, self._db_thread.shutdown)
        self._shared_store_lock.close()
        self._immediate_store_lock.close()
        self._immediate.close()


def _deliver(batch: list[tuple[Any, asyncio.Future]], results: list) -> None:
    for (_op, fut), result in zip(batch, results, strict=True):
        if fut.done():
            continue  # its request was cancelled (client gone)
        if isinstance(result, BaseException) and not isinstance(result, CartonStoreError):
            fut.set_exception(result)
        else:
            fut.set_result(result)
