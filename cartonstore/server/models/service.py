"""ModelService: what the daemon does, independent of HTTP.

It hands out model directories and the leases on them (written by the
group commit under the shared store lock), loads and unloads models
(Triton's repository API), and keeps the pins of loaded models alive: one
class, since loads, leases and pins share their state (``_pins``). Blocking
store work runs in worker threads; concurrent requests for one model share
one fetch and one materialization.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sqlite3
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from cartonstore.config.load import LeaseSettings
from cartonstore.config.runners import RunnerSettings
from cartonstore.errors import CartonStoreError, InvalidInput, NotFound, Unavailable
from cartonstore.fetch.puller import Puller
from cartonstore.format.digest import is_sha256
from cartonstore.format.dtypes import tensor_metadata
from cartonstore.runner.builtin_runners import metadata_platform
from cartonstore.server.checks.pool import CheckPool
from cartonstore.server.tensors.arena import DEFAULT_SIZE as ARENA_SIZE
from cartonstore.server.tensors.shm_regions import Peer, ShmRegions
from cartonstore.store import Store
from cartonstore.store.gc.plan import GcPolicy, GcReport
from cartonstore.store.group_commit import GroupCommit
from cartonstore.store.metadata.adopted_rows import lists_adopted
from cartonstore.store.metadata.names import (
    HEX,
    VOLUME_PREFIX,
    carton_named,
    pin_lease_id,
    restore_name,
    validate_name,
)
from cartonstore.store.root.owner import owner_token
from cartonstore.system.callers import Credentials
from cartonstore.system.single_flight import SingleFlight

from .caller_paths import source_caller
from .early_start import EarlyStart
from .gc_child import collect_in_child, gc_summary
from .lifecycle import is_idle, load_keep_alive, unload_at
from .load_params import add_uploaded, parse_triton_config
from .loaded_model import (
    OWNED_LEASE_PREFIXES,
    READY,
    UNAVAILABLE,
    Granted,
    LoadedModel,
    ready_reason,
    switch_id,
    triton_load_failure,
    triton_unknown_model,
)
from .loaded_self_tests import self_tested_on_load
from .metrics import Metrics
from .model_config import (
    batching_policy,
    caches_answers,
    check_against_carton,
    check_config_fields,
    max_batch_size,
)
from .node_status import node_status
from .response_cache import ResponseCache
from .restore import forget_loaded, remember_loaded
from .runner_plan import instance_devices
from .runtime import RunnerHost
from .schedulers import schedule
from .sequence_config import sequence_policy
from .turnover import Turnover

log = logging.getLogger("cartonstore.server")
T = TypeVar("T")

class ModelService:
    def __init__(self, store: Store, puller: Puller, leases: LeaseSettings, metrics: Metrics,
                 runners: RunnerSettings | None = None, *, shm_over_tcp: bool = False,
                 max_request_size: int = 256 << 20, arena_size: int = ARENA_SIZE, check_workers: int = 0,
                 daemon_id: str | None = None, allow_tcp_local_sources: bool = False,
                 budget: GcPolicy | None = None, gc_interval: float = 600.0, response_cache_size: int = 0) -> None:
        """daemon_id: who this daemon is in the index's loaded_models
        (server.id); None records nothing (restore.py). allow_tcp_local_sources:
        see caller_paths.py. budget, gc_interval: the [gc] settings, as
        GET /v1/node reports them. response_cache_size: [cache] size."""
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
        self.daemon_id = daemon_id
        self.allow_tcp_local_sources = allow_tcp_local_sources
        self.budget = budget or GcPolicy()
        self.gc_interval = gc_interval
        self.shm_regions = ShmRegions(allow_tcp=shm_over_tcp, max_read=max_request_size)
        self.check_pool = CheckPool(check_workers) if check_workers else None
        self.response_cache = ResponseCache(response_cache_size)
        self.runner_host = RunnerHost(runners or RunnerSettings(), store.layout.root / "run" / "runners",
                                      store.layout.tmp_dir, arena_size=arena_size,
                                      max_request_size=max_request_size)
        # Weak: a lock lives while a load holds or waits on it, not for every name ever asked.
        self._load_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self.models: dict[str, LoadedModel] = {}
        self._gc_lock = asyncio.Lock()
        self.ready = True
        # names a caller loaded or unloaded while a restore runs (ready is false): it leaves them alone
        self.asked: set[str] = set()
        # what keep_alive, max_loaded and load_on_demand do (turnover.py)
        self.turnover = Turnover(self.models, self.runner_host, self._unload, self.load, self._load_locks)

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
            digest = self.store.resolve(ref)
        except NotFound:
            return None
        self.store.refuse_changed_adopted(digest)   # a directory built earlier holds the blobs as they are now
        return digest

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
                                                          lease_id=lease_id, adopted_checked=True))
            if granted is not None:
                return granted
            ref = digest
        raise Unavailable(f"model {ref} was collected again and again while being leased; the store is "
                          "under more pressure than its size budget allows", subject=ref)

    def _lease_cached(self, conn: sqlite3.Connection, ref: str, ttl: float, holder: str | None,
                      lease_id: str | None, adopted_checked: bool = False) -> Granted | None:
        """In a batch (the shared store lock held): lease ref if it is a known
        name or manifest hash and its model directory is there. None sends
        the caller the long way (prefixes, sources, missing directories, and
        blobs adopted from another tool's files, whose stat model_dir checks
        first: ``adopted_checked``)."""
        digest = resolve_on(conn, ref)
        if digest is None or (not adopted_checked and lists_adopted(conn, digest)):
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
        if lease_id.startswith(VOLUME_PREFIX):
            raise InvalidInput(f"lease {lease_id!r} is a mounted volume's: it has no expiry to renew")
        row = await self._batch(lambda conn: self.store.index.extend_lease(conn, lease_id, ttl))
        return Granted(row, self.store.layout.model_dir_str(row.carton))

    async def release_lease(self, lease_id: str) -> None:
        if lease_id.startswith(OWNED_LEASE_PREFIXES):
            raise InvalidInput(f"lease {lease_id!r} is a daemon's own (a loaded model's pin or a version "
                               "switch): pins of loaded models are released by unloading the model")
        if not await self._batch(lambda conn: self.store.index.drop_lease(conn, lease_id)):
            raise NotFound(f"no lease {lease_id!r} (never taken, already released, or expired)", subject=lease_id)

    # -- Triton repository ---------------------------------------------------------

    async def load(self, name: str, params: dict[str, Any], *, version: str | None = None,
                   restoring: bool = False, peer: Peer | None = None) -> LoadedModel | None:
        """Fetch, materialize, pin, start the runners, then READY. Loads of
        one name queue behind each other (two concurrent loads start one
        runner). Loading another version of a loaded name starts the new
        runners, switches traffic, then stops the old ones; if the new
        version fails, the old one keeps serving. ``peer``: who asks (caller_paths.py)."""
        # A bad name is refused before any state is kept for it; a load naming no
        # carton may also name a stored one by its manifest hash (or a prefix).
        if params.get("source") or any(k.startswith("file:") for k in params) or not HEX.fullmatch(name):
            validate_name(name)
        keep_alive = load_keep_alive(params, self.runner_host.config.keep_alive)
        if not restoring:
            self.note_asked(name)
        lock = self._load_locks.get(name)
        if lock is None:
            lock = self._load_locks[name] = asyncio.Lock()
        try:
            async with lock:
                if restoring and name in self.asked:   # a caller's load or unload came first: theirs stands
                    return None
                model = await self._load_locked(name, params, version, peer)
                self.turnover.loaded(model, keep_alive, params)
                await remember_loaded(self, model)
                return model
        except CartonStoreError as e:   # Triton's words first: clients match on them
            e.message = triton_load_failure(name, e.message)
            raise

    def note_asked(self, name: str) -> None:
        """A caller loads or unloads ``name``: a restore under way leaves it alone."""
        if not self.ready:
            self.asked.add(name)

    async def _load_locked(self, name: str, params: dict[str, Any], version: str | None,
                           peer: Peer | None) -> LoadedModel:
        previous = self.models.get(name)
        serving = previous if previous is not None and previous.state == READY else None
        model = LoadedModel(name)
        if serving is None:
            self.models[name] = model
        named_before = await self._batch(lambda conn: carton_named(conn, name))
        renames = bool(params.get("source")) or any(k.startswith("file:") for k in params)
        moved_to: str | None = None   # where this load pointed the name, once known
        unknown = False               # the name resolved to nothing: the load leaves no trace

        def serving_as_asked(digest: str) -> bool:   # the load then changes nothing, and starts nothing
            return serving is not None and serving.digest == digest and serving.config == model.config and \
                serving.serving_state == READY
        # runners started while the carton's blobs come, unless that version already serves as asked
        early = EarlyStart(self.store, self.runner_host, model, skip=serving_as_asked)
        try:
            model.config = parse_triton_config(params.get("config"))
            check_config_fields(model.config)
            instance_devices(model.config, self.runner_host.config.devices)  # a bad config fails before any work
            try:   # a restore names the version it loads (restore.py)
                digest = version if version is not None else await self._load_source(name, params, peer,
                                                                                     early.committed)
            except NotFound:
                unknown = previous is None and not renames
                raise
            moved_to = digest if renames else None
            if serving_as_asked(digest):
                assert serving is not None
                await early.close()
                serving.reason = ready_reason(serving)  # drops a "reload failed" left by an earlier load
                return serving  # already loaded as asked: nothing to restart
            if serving is not None and serving.digest != digest:  # the old version stays pinned until stopped
                await self._hold(switch_id(self.owner, name), serving.digest,  # type: ignore[arg-type]  # READY: a digest
                                 f"switching:{name}")
            self._pins[self.pin_of(name)] = (digest, f"loaded:{name}")  # keep_pins renews the new version from now
            granted = await self.take_lease(digest, self.leases.pin_ttl, f"loaded:{name}", self.pin_of(name))
            model.digest = granted.lease.carton
            model.carton = await asyncio.to_thread(self.store.config_of, model.digest)
            check_against_carton(name, model.carton, model.config)
            model.max_batch_size = max_batch_size(model.carton, model.config)
            model.response_cache = caches_answers(name, model.config, self.response_cache.capacity)
            policy = batching_policy(model.carton, model.config)
            sequencing = sequence_policy(model.config, model.carton.inputs)
            if serving is None:   # a version switch takes the slot its name holds
                await self.turnover.make_room(name)
            model.runners = await self.runner_host.start(name, model.digest, granted.path, model.carton,
                                                         model.config, await early.starting(model))
            if serving is None:
                await self.turnover.fit_memory(model)
            schedule(model, policy, sequencing, self.runner_host.config.max_inflight)
            await self_tested_on_load(self.runner_host, model, self.store.layout.model_path(model.digest))
        except BaseException as e:
            await asyncio.shield(early.close())
            if model.runners is not None:   # started by this load, which failed after: nothing serves on them
                runners, model.runners = model.runners, None
                await asyncio.shield(self.runner_host.stop(runners))
            reason = str(e) if isinstance(e, CartonStoreError) else f"load failed: {type(e).__name__}"
            log.warning("load of %s failed: %s", name, reason)
            if moved_to is not None:  # this load pointed the name at its carton: point it back
                await self._batch(lambda conn: restore_name(conn, name, named_before, only_from=moved_to))
            if unknown:   # nothing was pinned or leased yet: not in the index, not in memory
                self.models.pop(name, None)
            else:
                await self._restore(name, serving, model, reason)
            raise
        model.state = READY
        model.reason = ready_reason(model)
        self.models[name] = model
        self.response_cache.drop(name)   # answers of the version it replaces
        log.info("model %s version %s loaded%s", name, model.digest[:12],
                 "" if model.runners is not None else f" ({model.reason})")
        if serving is not None:
            try:
                await self._drained(serving)
                await self.runner_host.stop(serving.runners)
            finally:
                await self._let_go(switch_id(self.owner, name))
        return model

    async def _drained(self, model: LoadedModel) -> None:
        """Requests waiting in the model's batcher are sent before its
        runners stop (stop waits only for those already sent), within
        runners.stop_grace."""
        if model.batcher is None:
            return
        try:
            await asyncio.wait_for(model.batcher.drain(), self.runner_host.config.stop_grace)
        except asyncio.TimeoutError:
            log.warning("model %s: batched requests still waiting after runners.stop_grace", model.name)

    async def _restore(self, name: str, serving: LoadedModel | None, model: LoadedModel, reason: str) -> None:
        """A failed load: the version that served before goes on serving
        (its pin restored), else the name is UNAVAILABLE with the reason."""
        if serving is not None:
            serving.reason = f"reload failed, still serving this version: {reason}"
            self.models[name] = serving
            await self._hold(self.pin_of(name), serving.digest,  # type: ignore[arg-type]  # serving: a digest
                             f"loaded:{name}")
            await self._let_go(switch_id(self.owner, name))
            return
        model.state, model.reason = UNAVAILABLE, reason
        self.models[name] = model
        await self._let_go(self.pin_of(name))

    async def _hold(self, lease_id: str, digest: str, holder: str) -> None:
        """A lease this daemon owns and renews (pins, switches) until _let_go."""
        self._pins[lease_id] = (digest, holder)
        ttl = self.leases.pin_ttl
        await self._batch(lambda conn: self.store.index.insert_lease(conn, digest, ttl, holder, lease_id))

    async def _let_go(self, lease_id: str) -> None:
        self._pins.pop(lease_id, None)
        await self._batch(lambda conn: self.store.index.drop_lease(conn, lease_id))

    async def _load_source(self, name: str, params: dict[str, Any], peer: Peer | None,
                           on_committed: Callable[[str], None] | None = None) -> str:
        files = {k[len("file:"):]: v for k, v in params.items() if k.startswith("file:")}
        source = params.get("source")
        if source is not None and not isinstance(source, str):
            raise InvalidInput(f"parameter 'source' must be a string (a URL or a path), got {type(source).__name__}")
        if files and source:
            raise InvalidInput("give either 'source' or 'file:' parameters, not both")
        # The name was checked by load(); the daemon moving its own loaded
        # name is a version switch, so the add is forced (leases stay valid).
        if files:
            result = await add_uploaded(self.puller, self.store.layout.tmp_dir, name, files)
            self.metrics.dedup_saved_bytes.inc(result.bytes_reused)
            return result.digest
        if source:
            # Loads of one name queue on its lock, so nothing here could share an add.
            caller = source_caller(source, peer, allow_tcp=self.allow_tcp_local_sources)
            result = await self.puller.add(source, name=name, force=True, confined=True, caller=caller,
                                           on_committed=on_committed)
            self.metrics.dedup_saved_bytes.inc(result.bytes_reused)
            return result.digest
        digest = await self._known(name)
        if digest is None:
            raise NotFound(f"unknown model {name!r}: not in the store; load it with a 'source' parameter",
                           subject=name)
        return digest

    async def _known(self, ref: str) -> str | None:
        """The carton ref names: a name or hash in a batch (no thread hop
        when nothing waits), a hash prefix on a worker thread."""
        digest = await self._batch(lambda conn: resolve_on(conn, ref))
        return digest if digest is not None else await asyncio.to_thread(self._resolve_fast, ref)

    async def unload(self, name: str) -> None:
        self.note_asked(name)
        model = self.models.get(name)
        never_loaded = model is None or model.digest is None
        lock = self._load_locks.get(name)
        loading = lock is not None and lock.locked()  # a first load still fetching: unload after it
        if never_loaded and not loading and await self._known(name) is None:
            await forget_loaded(self, name)   # a restore that could not find its carton leaves a row: gone now
            raise NotFound(f"failed to unload {name!r}: {triton_unknown_model(name)}", subject=name)
        await self._unload(name, "asked", "unloaded")

    async def _unload(self, name: str, why: str, reason: str, *, if_idle: LoadedModel | None = None) -> bool:
        """Stop ``name``'s runners and drop its pin; its files stay in the store and
        its name stays known. ``why``: the label of cartonstore_model_unloads_total;
        ``reason``: what the index says. ``if_idle``: only if that model is still
        the one loaded and still idle (a request or a load may have come)."""
        async with self._load_locks.setdefault(name, asyncio.Lock()):  # after a load in progress
            model = self.models.get(name)
            if if_idle is not None and (model is not if_idle or not is_idle(model, self.turnover.usage)):
                return False
            if model is not None:
                model.state, model.reason = UNAVAILABLE, "unloading"
            try:
                if model is not None:
                    await self._drained(model)
                await self.runner_host.stop(model.runners if model is not None else None)
            finally:
                await self._let_go(self.pin_of(name))
            gone = LoadedModel(name, model.digest if model else None, UNAVAILABLE, reason, unloaded=True)
            if model is not None:
                gone.reload_params = model.reload_params
            self.models[name] = gone
            self.response_cache.drop(name)
            await forget_loaded(self, name)
            self.metrics.model_unloads.labels(why).inc()
            log.info("model %s %s", name, reason)   # "unloaded", or why
            return True

    async def index(self, ready_only: bool) -> list[dict[str, str]]:
        rows = dict(await asyncio.to_thread(self._stored_names))
        out: dict[str, dict[str, Any]] = {n: {"name": n, "version": d, "state": UNAVAILABLE, "reason": "not loaded"}
                                          for n, d in rows.items()}
        for name, model in self.models.items():
            out[name] = model.as_index_row()
            going = unload_at(model, self.turnover.usage)
            if going is not None:
                out[name]["unload_at"] = going
        listed = sorted(out.values(), key=lambda r: r["name"])
        return [r for r in listed if r["state"] == READY] if ready_only else listed

    def _stored_names(self) -> list[tuple[str, str]]:
        return [(n, c.row.digest) for c in self.store.list() for n in c.names]

    def loaded(self, name: str, version: str | None) -> LoadedModel | None:
        model = self.models.get(name)
        if model is None or model.serving_state != READY:
            return None
        if version is not None and version != model.digest:
            return None
        return model

    async def metadata(self, name: str, version: str | None) -> dict[str, Any]:
        model = self.models.get(name)
        digest = model.digest if model and model.digest else await asyncio.to_thread(self._resolve_fast, name)
        if digest is None:
            raise NotFound(triton_unknown_model(name), subject=name)
        if version is not None and version != digest:
            raise NotFound(f"{triton_unknown_model(name, version)}: its version is {digest}", subject=version)
        cfg = await asyncio.to_thread(self.store.config_of, digest)
        return {"name": name, "versions": [digest], "platform": metadata_platform(cfg.runner.runner_name),
                "inputs": tensor_metadata(cfg.inputs), "outputs": tensor_metadata(cfg.outputs)}

    # -- background ------------------------------------------------------------------

    async def keep_pins(self) -> None:
        """Renew the leases this daemon owns (pins of loaded models, the old
        version's during a switch) and drop expired leases, forever. A
        renewal writes only what _pins still says, checked in the group
        commit itself, so it never brings back a pin an unload dropped nor
        points one at another version."""
        while True:
            await asyncio.sleep(max(1.0, self.leases.pin_ttl / 3))
            for lease_id, (digest, holder) in list(self._pins.items()):
                try:
                    await self._batch(functools.partial(self._renew_owned, lease_id=lease_id, digest=digest,
                                                        holder=holder))
                except CartonStoreError as e:
                    log.warning("could not renew lease %s: %s", lease_id, e)
            try:
                await asyncio.to_thread(self.store.index.expire_leases)
            except CartonStoreError as e:
                log.warning("could not expire leases: %s", e)

    def _renew_owned(self, conn: sqlite3.Connection, lease_id: str, digest: str, holder: str) -> None:
        if self._pins.get(lease_id, (None, None))[0] == digest:
            self.store.index.insert_lease(conn, digest, self.leases.pin_ttl, holder, lease_id)

    async def collect(self, policy: GcPolicy) -> GcReport:
        """One collection at a time per daemon, in a child process (see
        server/models/gc_child.py); the store lock orders it with every other process."""
        async with self._gc_lock:
            started = time.monotonic()
            report = await collect_in_child(self.store.root, policy)
        log.info("gc%s in %.2fs: %s", " (dry run)" if policy.dry_run else "", time.monotonic() - started,
                 gc_summary(report))
        return report

    async def keep_within_budget(self, policy: GcPolicy, interval: float) -> None:
        """Collect on our own every interval when a size budget or a free-space
        floor is set."""
        if policy.max_size is None and policy.min_free is None:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                await self.collect(policy)  # logs its own line
            except CartonStoreError as e:
                log.warning("gc failed: %s", e)

    async def shutdown(self) -> None:
        """Runners stop; pins of this daemon's loaded models lapse now
        rather than at expiry."""
        self.ready = False
        await self.runner_host.stop_all()
        for lease_id in list(self._pins):
            await self._db(self.store.index.delete_lease, lease_id)
            self._pins.pop(lease_id, None)
        await self._commits.close()
        self.shm_regions.close()
        if self.check_pool is not None:
            await self.check_pool.close()

    def inference_values(self) -> list[tuple[str, str, dict]]:
        """(name, version, statistics) of each loaded version with runners."""
        return [(m.name, m.digest, m.runners.statistics.snapshot()) for m in tuple(self.models.values())
                if m.runners is not None and m.digest is not None and m.state == READY]

    def node_status(self) -> dict:
        """GET /v1/node (node_status.py); reads the index: call it off the event loop."""
        return node_status(self.store, self.budget, self.gc_interval, self.metrics.served_bytes)

    def live_values(self) -> dict[str, float]:
        stats = self.puller.stats
        return {"store_bytes": self.store.index.stored_bytes(), "leases": self.store.index.count_live_leases(),
                # as statuses() counts them
                "loaded_models": sum(1 for m in tuple(self.models.values()) if m.serving_state == READY),
                "runners": self.runner_host.statuses(),
                "fetched_bytes": stats.bytes_received, "fetch_requests": stats.requests,
                "source_bytes": stats.snapshot()["source_bytes"], "source_figures": self.store.source_bytes(),
                "models": self.store.index.model_states(), "gc_outcome": self.store.index.last_gc_outcome(),
                "served": self.metrics.served_bytes,
                "arena": self.runner_host.arena_stats(),
                "spares": self.runner_host.prewarm.status() if self.runner_host.prewarm is not None else None,
                "check_workers": self.check_pool.stats() if self.check_pool is not None else None,
                "response_cache": self.response_cache.figures() if self.response_cache.capacity else None}


def resolve_on(conn: sqlite3.Connection, ref: str) -> str | None:
    """The manifest hash a name or hash stands for, read in the caller's
    transaction; None for anything else (Store.resolve handles prefixes)."""
    ref = ref.strip()
    if is_sha256(ref):
        return ref if conn.execute("SELECT 1 FROM cartons WHERE digest=?", (ref,)).fetchone() else None
    return carton_named(conn, ref)
