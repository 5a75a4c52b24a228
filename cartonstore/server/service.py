"""ModelService: what the daemon does, independent of HTTP.

It loads and unloads models (Triton's repository API), hands out leases,
and keeps the pins of loaded models alive. Blocking store work runs in
worker threads; concurrent requests for one model share one fetch and one
materialization.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CartonStoreError, InvalidInput, NotFound, Unavailable
from ..fetch.puller import Puller
from ..format.dtypes import carton_dtype_to_v2, shape_to_v2_dims
from ..flights import SingleFlight
from ..format.manifest import is_sha256
from ..format.paths import validate_carton_path
from ..store import Store
from ..store.gc import GcPolicy, GcReport
from ..store.index import WOULD_WAIT, ImmediateWriter, LeaseRow
from ..store.locks import HeldLock
from ..store.materialize import remove_tree
from ..store.owner import tmp_name
from .collector import collect_in_child
from .metrics import Metrics

log = logging.getLogger("cartonstore.server")

READY, LOADING, UNAVAILABLE = "READY", "LOADING", "UNAVAILABLE"


@dataclass(frozen=True)
class LeaseSettings:
    default_ttl: float = 60.0
    max_ttl: float = 3600.0
    pin_ttl: float = 120.0


@dataclass
class LoadedModel:
    name: str
    digest: str | None = None
    state: str = LOADING
    reason: str = ""
    config: dict | None = None

    def as_index_row(self) -> dict[str, str]:
        row = {"name": self.name, "state": self.state, "reason": self.reason}
        if self.digest:
            row["version"] = self.digest
        return row


@dataclass
class Granted:
    lease: LeaseRow
    path: Path

    def as_json(self) -> dict[str, Any]:
        return {"lease": self.lease.id, "path": str(self.path), "manifest_sha256": self.lease.carton,
                "expires_at": self.lease.expires_at}


def pin_id(name: str) -> str:
    return f"pin:{name}"


class ModelService:
    def __init__(self, store: Store, puller: Puller, leases: LeaseSettings, metrics: Metrics) -> None:
        self.store = store
        self.puller = puller
        self.leases = leases
        self.metrics = metrics
        self.models: dict[str, LoadedModel] = {}
        self._flights = SingleFlight()
        self._gc_lock = asyncio.Lock()
        self._db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cartonstore-db")
        self._queue: list[tuple[Any, asyncio.Future]] = []
        self._draining = False
        self._shared_store_lock = HeldLock(store.lock(shared=True))
        # The fast way for the same operations, on the loop itself (see _batch).
        self._immediate = ImmediateWriter(store.layout.index_db)
        self._immediate_store_lock = HeldLock(store.lock(shared=True))  # its own fd: flocks belong to one
        self._checkpointing = False
        self.ready = True

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
            path = await self._flights.run(key, lambda: self.puller.materialize(digest or ref))
        except CartonStoreError:
            self.metrics.fetch_errors.inc()
            raise
        return path.name, path

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
            digest, path = await self.model_dir(ref)
            granted = await self._batch(lambda conn, d=digest: self._lease_cached(conn, d, ttl, holder, lease_id))
            if granted is not None:
                return granted
            ref = digest
        raise Unavailable(f"model {ref} was collected again and again while being leased; the store is "
                          "under more pressure than its size budget allows", subject=ref)

    def _lease_cached(self, conn, ref: str, ttl: float, holder: str | None,  # noqa: ANN001
                      lease_id: str | None) -> Granted | None:
        """In a batch (the shared store lock held): lease ref if it is a known
        name or manifest hash and its model directory is there. None sends
        the caller the long way (prefixes, sources, missing directories)."""
        digest = _resolve_on(conn, ref)
        if digest is None:
            return None
        path = self.store.layout.model_path(digest)
        if not path.is_dir():
            return None
        return Granted(self.store.index.insert_lease(conn, digest, ttl, holder, lease_id), path)

    async def _batch(self, op):  # noqa: ANN001, ANN202
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
        batch, self._queue = self._queue, []
        results: object = WOULD_WAIT
        # While the database thread checkpoints, writes queue behind it there:
        # a checkpoint that writers keep overtaking never lets the WAL restart
        # from its beginning, and the file grows without end.
        if not self._checkpointing and self._immediate_store_lock.try_acquire():
            try:
                results = self._immediate.try_run([op for op, _ in batch])
            except Exception as e:  # noqa: BLE001 - a bug: handed to every waiter
                results = [e] * len(batch)
            finally:
                self._immediate_store_lock.release()
        if results is WOULD_WAIT:
            self._queue = batch + self._queue
            asyncio.ensure_future(self._drain())
            return
        self._draining = False
        _deliver(batch, results)
        if self._immediate.checkpoint_due and not self._checkpointing:
            self._checkpointing = True
            asyncio.ensure_future(self._checkpoint())

    async def _drain(self) -> None:
        """The patient way: batches on the database thread until none is left."""
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    results = await loop.run_in_executor(self._db_thread, self._run_batch, [op for op, _ in batch])
                except BaseException as e:  # noqa: BLE001 - handed to every waiter
                    results = [e] * len(batch)
                _deliver(batch, results)
        finally:
            self._draining = False

    async def _checkpoint(self) -> None:
        """The WAL the loop's writes grew, copied back off the loop."""
        try:
            await self._db(self.store.index.checkpoint)
            self._immediate.checkpointed()
        except CartonStoreError as e:
            log.warning("%s", e)
        finally:
            self._checkpointing = False

    def _run_batch(self, ops: list) -> list:
        with self._shared_store_lock:  # a collection sees all of these leases or none
            return self.store.index.run_batch(ops)

    async def _db(self, fn, *args):  # noqa: ANN001, ANN002, ANN202
        """Index work on the daemon's one database thread: SQLite serializes
        writers anyway, and one thread spares the hand-offs between many."""
        return await asyncio.get_running_loop().run_in_executor(self._db_thread, fn, *args)

    async def renew_lease(self, lease_id: str, ttl: float) -> Granted:
        row = await self._batch(lambda conn: self.store.index.extend_lease(conn, lease_id, ttl))
        return Granted(row, self.store.layout.model_path(row.carton))

    async def release_lease(self, lease_id: str) -> None:
        if lease_id.startswith("pin:"):
            raise InvalidInput("pins of loaded models are released by unloading the model")
        if not await self._batch(lambda conn: self.store.index.drop_lease(conn, lease_id)):
            raise NotFound(f"no lease {lease_id!r} (never taken, already released, or expired)", subject=lease_id)

    # -- Triton repository ---------------------------------------------------------

    async def load(self, name: str, params: dict[str, Any]) -> LoadedModel:
        model = self.models.get(name) or LoadedModel(name)
        model.state, model.reason = LOADING, ""
        self.models[name] = model
        try:
            model.config = parse_triton_config(params.get("config"))
            ref = await self._load_source(name, params)
            granted = await self.take_lease(ref, self.leases.pin_ttl, f"loaded:{name}", pin_id(name))
            digest = granted.lease.carton
        except BaseException as e:
            model.state = UNAVAILABLE
            model.reason = str(e) if isinstance(e, CartonStoreError) else f"load failed: {type(e).__name__}"
            raise
        model.digest, model.state, model.reason = digest, READY, ""
        return model

    async def _load_source(self, name: str, params: dict[str, Any]) -> str:
        files = {k[len("file:"):]: v for k, v in params.items() if k.startswith("file:")}
        source = params.get("source")
        if source is not None and not isinstance(source, str):
            raise InvalidInput(f"parameter 'source' must be a string (a URL or a path), got {type(source).__name__}")
        if files and source:
            raise InvalidInput("give either 'source' or 'file:' parameters, not both")
        if files:
            return await self._add_uploaded(name, files)
        if source:
            result = await self._flights.run(f"add:{source}", lambda: self.puller.add(source, name=name))
            self.metrics.dedup_saved_bytes.inc(result.bytes_reused)
            return result.digest
        if not await self._known(name):
            raise NotFound(f"unknown model {name!r}: not in the store; load it with a 'source' parameter",
                           subject=name)
        return name

    async def _known(self, ref: str) -> bool:
        """Whether ref names a known carton: a name or hash in a batch (no
        thread hop when nothing waits), a hash prefix on a worker thread."""
        if await self._batch(lambda conn: _resolve_on(conn, ref)) is not None:
            return True
        return await asyncio.to_thread(self._resolve_fast, ref) is not None

    async def _add_uploaded(self, name: str, files: dict[str, Any]) -> str:
        """Triton's file:<version>/<path> uploads: one .carton, or the files of
        an unpacked carton."""
        work = tmp_name(self.store.layout.tmp_dir, "upload")
        try:
            decoded = {k: _b64(k, v) for k, v in files.items()}
            cartons = [k for k in decoded if k.endswith(".carton")]
            work.mkdir()
            if len(decoded) == 1 and cartons:
                target = work / "upload.carton"
                await asyncio.to_thread(target.write_bytes, decoded[cartons[0]])
            else:
                target = work / "carton"
                await asyncio.to_thread(_write_tree, target, decoded)
            result = await self.puller.add(str(target), name=name)
            self.metrics.dedup_saved_bytes.inc(result.bytes_reused)
            return result.digest
        finally:
            await asyncio.to_thread(remove_tree, work)

    async def unload(self, name: str) -> None:
        model = self.models.get(name)
        never_loaded = model is None or model.digest is None
        if never_loaded and not await self._known(name):
            raise NotFound(f"unknown model {name!r}", subject=name)
        await self._batch(lambda conn: self.store.index.drop_lease(conn, pin_id(name)))
        self.models[name] = LoadedModel(name, model.digest if model else None, UNAVAILABLE, "unloaded")

    async def index(self, ready_only: bool) -> list[dict[str, str]]:
        rows = dict(await asyncio.to_thread(self._stored_names))
        out = {n: {"name": n, "version": d, "state": UNAVAILABLE, "reason": "not loaded"} for n, d in rows.items()}
        for name, model in self.models.items():
            out[name] = model.as_index_row()
        listed = sorted(out.values(), key=lambda r: r["name"])
        return [r for r in listed if r["state"] == READY] if ready_only else listed

    def _stored_names(self) -> list[tuple[str, str]]:
        return [(n, c.row.digest) for c in self.store.list() for n in c.names]

    def loaded(self, name: str, version: str | None) -> LoadedModel | None:
        model = self.models.get(name)
        if model is None or model.state != READY:
            return None
        if version is not None and version != model.digest:
            return None
        return model

    async def metadata(self, name: str, version: str | None) -> dict[str, Any]:
        model = self.models.get(name)
        digest = model.digest if model and model.digest else await asyncio.to_thread(self._resolve_fast, name)
        if digest is None:
            raise NotFound(f"unknown model {name!r}", subject=name)
        if version is not None and version != digest:
            raise NotFound(f"model {name!r} has no version {version!r} (its version is {digest})", subject=version)
        cfg = await asyncio.to_thread(self.store.config_of, digest)
        return {"name": name, "versions": [digest], "platform": f"carton_{cfg.runner.runner_name}",
                "inputs": tensor_metadata(cfg.inputs), "outputs": tensor_metadata(cfg.outputs)}

    # -- background ------------------------------------------------------------------

    async def keep_pins(self) -> None:
        """Renew the pins of loaded models and drop expired leases, forever."""
        while True:
            await asyncio.sleep(max(1.0, self.leases.pin_ttl / 3))
            for name, model in list(self.models.items()):
                if model.state == READY and model.digest:
                    try:
                        await asyncio.to_thread(self.store.index.create_lease, model.digest, self.leases.pin_ttl,
                                                f"loaded:{name}", pin_id(name))
                    except CartonStoreError as e:
                        log.warning("could not renew the pin of %s: %s", name, e)
            try:
                await asyncio.to_thread(self.store.index.expire_leases)
            except CartonStoreError as e:
                log.warning("could not expire leases: %s", e)

    async def collect(self, policy: GcPolicy) -> GcReport:
        """One collection at a time per daemon, in a child process (see
        collector.py); the store lock orders it with every other process."""
        async with self._gc_lock:
            return await collect_in_child(self.store.root, policy)

    async def keep_within_budget(self, policy: GcPolicy, interval: float) -> None:
        """Collect on our own every interval when a size budget or a free-space
        floor is set."""
        if policy.max_size is None and policy.min_free is None:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                report = await self.collect(policy)
                if report.freed_bytes:
                    log.info("gc freed %d bytes (%d model(s) evicted)", report.freed_bytes,
                             len(report.evicted_models))
            except CartonStoreError as e:
                log.warning("gc failed: %s", e)

    async def shutdown(self) -> None:
        """Pins of this daemon's loaded models lapse now rather than at expiry."""
        self.ready = False
        for name, model in self.models.items():
            if model.state == READY:
                await self._db(self.store.index.delete_lease, pin_id(name))
        self._db_thread.shutdown(wait=True)
        self._shared_store_lock.close()
        self._immediate_store_lock.close()
        self._immediate.close()

    def live_values(self) -> dict[str, float]:
        stats = self.puller.stats
        return {"store_bytes": self.store.index.stored_bytes(), "leases": self.store.index.count_live_leases(),
                "loaded_models": sum(1 for m in self.models.values() if m.state == READY),
                "fetched_bytes": stats.bytes_received, "fetch_requests": stats.requests}


def _resolve_on(conn, ref: str) -> str | None:  # noqa: ANN001
    """The manifest hash a name or hash stands for, read in the caller's
    transaction; None for anything else (Store.resolve handles prefixes)."""
    ref = ref.strip()
    if is_sha256(ref):
        return ref if conn.execute("SELECT 1 FROM cartons WHERE digest=?", (ref,)).fetchone() else None
    row = conn.execute("SELECT carton FROM names WHERE name=?", (ref,)).fetchone()
    return row[0] if row else None


def _deliver(batch: list[tuple[Any, asyncio.Future]], results: list) -> None:
    for (_op, fut), result in zip(batch, results, strict=True):
        if fut.done():
            continue  # its request was cancelled (client gone)
        if isinstance(result, BaseException) and not isinstance(result, CartonStoreError):
            fut.set_exception(result)
        else:
            fut.set_result(result)


def tensor_metadata(specs) -> list[dict[str, Any]]:  # noqa: ANN001
    return [{"name": s.name, "datatype": carton_dtype_to_v2(s.dtype), "shape": shape_to_v2_dims(s.shape)}
            for s in specs or ()]


def parse_triton_config(value: Any) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"parameter 'config' must be a JSON string, got {type(value).__name__}")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise InvalidInput(f"parameter 'config' is not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise InvalidInput("parameter 'config' must be a JSON object (a Triton ModelConfig)")
    return parsed


def _b64(key: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise InvalidInput(f"parameter 'file:{key}' must be a base64 string, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"parameter 'file:{key}' is not valid base64") from None


def _write_tree(root: Path, files: dict[str, bytes]) -> None:
    """Files of an unpacked carton named file:<version>/<path>; paths are
    checked so an upload can never write outside its directory."""
    for key, data in files.items():
        _version, _, rel = key.partition("/")
        if not rel:
            raise InvalidInput(f"parameter 'file:{key}' must be named file:<version>/<path>")
        validate_carton_path(rel)
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    if not (root / "carton.toml").exists():
        shutil.rmtree(root, ignore_errors=True)
        raise InvalidInput("the uploaded files are not a carton: give one file:<v>/<name>.carton, "
                           "or the files of an unpacked carton including carton.toml")
