"""A hold: a short lease on a carton while its missing blobs are fetched
and its model directory is built.

A collection never evicts a leased carton's blobs. Without a hold, a store
under its size budget could evict a blob just restored, before the carton
was complete or its directory built, and the add or the load failed with
"missing blob" although every source was fine. The hold is taken under the
shared store lock, so it lands between two turns of a running collection
and every later turn sees it; it is renewed while the work goes on and
dropped after. A process that dies leaves it to the next rm or collection,
which drop it at once (store/gc/holds.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator

from cartonstore.errors import CartonStoreError
from cartonstore.store import Store
from cartonstore.store.gc.holds import new_hold_id

log = logging.getLogger("cartonstore.fetch")

HOLD_TTL = 300.0


def _take(store: Store, digest: str, holder: str) -> str:
    with store.lock(shared=True):
        return store.index.create_lease(digest, HOLD_TTL, holder, new_hold_id(store)).id


@contextlib.asynccontextmanager
async def holding(store: Store, digest: str, what: str) -> AsyncIterator[None]:
    """Hold digest against eviction for the duration of the block."""
    taking = asyncio.ensure_future(asyncio.to_thread(_take, store, digest, f"cartonstore {what} (pid {os.getpid()})"))
    try:
        lease_id = await asyncio.shield(taking)
    except asyncio.CancelledError:  # the thread takes it anyway: drop it once taken
        taking.add_done_callback(functools.partial(_drop_once_taken, store))
        raise
    renewal = asyncio.create_task(_renew(store, lease_id))
    try:
        yield
    finally:
        renewal.cancel()
        await asyncio.gather(renewal, return_exceptions=True)
        try:
            await asyncio.to_thread(store.index.delete_lease, lease_id)
        except CartonStoreError as e:  # it expires on its own
            log.warning("could not drop hold %s on %s: %s", lease_id, digest[:12], e)


def _drop_once_taken(store: Store, taking: asyncio.Future) -> None:
    if not taking.cancelled() and taking.exception() is None:
        asyncio.ensure_future(asyncio.to_thread(  # noqa: RUF006 - the thread's future holds the task to its end
            store.index.delete_lease, taking.result()))


async def _renew(store: Store, lease_id: str) -> None:
    while True:
        await asyncio.sleep(HOLD_TTL / 3)
        try:
            await asyncio.to_thread(store.index.renew_lease, lease_id, HOLD_TTL)
        except CartonStoreError as e:
            log.warning("could not renew hold %s: %s", lease_id, e)
