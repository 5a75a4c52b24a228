"""Leasing: model directories and the leases on them, the half of the
daemon's ModelService that the lease routes use (and loads build on).

A lease is written by the group commit (store/group_commit.py) under the
shared store lock; concurrent requests for one model share one fetch and
one materialization.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from cartonstore.config.load import LeaseSettings
from cartonstore.errors import CartonStoreError, InvalidInput, NotFound, Unavailable
from cartonstore.fetch.puller import Puller
from cartonstore.format.digest import is_sha256
from cartonstore.store import Store
from cartonstore.store.group_commit import GroupCommit
from cartonstore.store.metadata.names import carton_named, pin_lease_id
from cartonstore.store.root.owner import owner_token
from cartonstore.system.callers import Credentials
from cartonstore.system.single_flight import SingleFlight

from .loaded_model import OWNED_LEASE_PREFIXES, Granted
from .metrics import Metrics

T = TypeVar("T")


class Leasing:
    def __init__(self, store: Store, puller: Puller, leases: LeaseSettings, metrics: Metrics) -> None:
        self.store = store
        self.puller = puller
        self.leases = leases
        self.metrics = metrics
        # The store's owner token of this process names the leases it takes and its runners' sockets
        # (store/root/owner.py); the caller made it off the event loop, so this only looks it up.
        self.owner = owner_token(store.layout.tmp_dir)
        self._pins: dict[str, tuple[str, str]] = {}  # leases this daemon renews: id -> (carton, holder)
        self._flights = SingleFlight()
        self._commits = GroupCommit(store)

    def pin_of(self, name: str) -> str:
        """The lease by which this daemon keeps the model it loaded as ``name``."""
        return pin_lease_id(self.owner, name)

    # -- materializing ---------------------------------------------------------

    async def model_dir(self, ref: str) -> tuple[str, Path]:
        """Resolve, fetch what is missing and materialize; shared by concurrent callers."""
        digest = await asyncio.to_thread(self._resolve_fast, ref)
        if digest is not None:
            path = self.store.layout.model_path(digest)
            if path.is_dir():
                self.metrics.cache_hits.inc()
                return digest, path
        self.metrics.cache_misses.inc()
        key = digest or ref
        try:
            # a path a caller names is added first, read as that caller (added_as), never here
            path = await self._flights.run(key, lambda: self.puller.materialize(digest or ref, local=False))
        except CartonStoreError:
            self.metrics.fetch_errors.inc()
            raise
        return path.name, path

    async def added_as(self, path: str, caller: Credentials | None) -> str:
        """The digest of the carton at ``path`` (a path on this host), added
        with ``caller``'s rights (None: the daemon's); concurrent callers of
        one identity share one add."""
        key = f"{path}\n{caller}"
        try:
            result = await self._flights.run(key, lambda: self.puller.add(path, confined=True, caller=caller))
        except CartonStoreError:
            self.metrics.fetch_errors.inc()
            raise
        return result.digest

    def _resolve_fast(self, ref: str) -> str | None:
        try:
            return self.store.resolve(ref)
        except NotFound:
            return None

    # -- leases ------------------------------------------------------------------

    def ttl(self, value: Any, *, field_name: str = "ttl") -> float:
        if value is None:
            return self.leases.default_ttl
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= self.leases.max_ttl:
            raise InvalidInput(f"{field_name} must be a number of seconds in (0, {self.leases.max_ttl:g}], "
                               f"got {value!r}")
        return float(value)

    async def take_lease(self, ref: str, ttl: float, holder: str | None, lease_id: str | None = None) -> Granted:
        """Materialize (fetching what is missing) and lease. The lease is
        written under the shared store lock after checking the directory is
        still there, so a collection either sees the lease or ran before it
        (and then the directory is built again). A cached model costs one
        worker-thread hop: resolve, check and write together."""
        granted = await self._batch(lambda conn: self._lease_cached(conn, ref, ttl, holder, lease_id))
        if granted is not None:
            self.metrics.cache_hits.inc()
            return granted
        for _attempt in range(5):
            digest, _path = await self.model_dir(ref)
            granted = await self._batch(functools.partial(self._lease_cached, ref=digest, ttl=ttl, holder=holder,
                                                          lease_id=lease_id))
            if granted is not None:
                return granted
            ref = digest
        raise Unavailable(f"model {ref} was collected again and again while being leased; the store is "
                          "under more pressure than its size budget allows", subject=ref)

    def _lease_cached(self, conn: sqlite3.Connection, ref: str, ttl: float, holder: str | None,
                      lease_id: str | None) -> Granted | None:
        """In a batch (the shared store lock held): lease ref if it is a known
        name or manifest hash and its model directory is there. None sends
        the caller the long way (prefixes, sources, missing directories)."""
        digest = resolve_on(conn, ref)
        if digest is None:
            return None
        where = self.store.layout.model_dir_str(digest)
        if not os.path.isdir(where):
            return None
        return Granted(self.store.index.insert_lease(conn, digest, ttl, holder, lease_id), where)

    async def _batch(self, op: Callable[[sqlite3.Connection], T]) -> T:
        return await self._commits.run(op)

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._commits.on_db_thread(fn, *args)

    async def renew_lease(self, lease_id: str, ttl: float) -> Granted:
        # A short ttl on a pin (this daemon's or another's on the store) would let gc take a serving model's
        # files. One of that name that does not exist is unknown like any other lease.
        if lease_id.startswith(OWNED_LEASE_PREFIXES) and (
                lease_id in self._pins or await self._db(self.store.index.lease, lease_id) is not None):
            raise InvalidInput(f"lease {lease_id!r} is a daemon's own (a loaded model's pin or a version "
                               "switch): it renews it itself")
        row = await self._batch(lambda conn: self.store.index.extend_lease(conn, lease_id, ttl))
        return Granted(row, self.store.layout.model_dir_str(row.carton))

    async def release_lease(self, lease_id: str) -> None:
        if lease_id.startswith(OWNED_LEASE_PREFIXES):
            raise InvalidInput(f"lease {lease_id!r} is a daemon's own (a loaded model's pin or a version "
                               "switch): pins of loaded models are released by unloading the model")
        if not await self._batch(lambda conn: self.store.index.drop_lease(conn, lease_id)):
            raise NotFound(f"no lease {lease_id!r} (never taken, already released, or expired)", subject=lease_id)


def resolve_on(conn: sqlite3.Connection, ref: str) -> str | None:
    """The manifest hash a name or hash stands for, read in the caller's
    transaction; None for anything else (Store.resolve handles prefixes)."""
    ref = ref.strip()
    if is_sha256(ref):
        return ref if conn.execute("SELECT 1 FROM cartons WHERE digest=?", (ref,)).fetchone() else None
    return carton_named(conn, ref)
