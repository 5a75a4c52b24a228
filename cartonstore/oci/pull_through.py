"""The node's pull-through registry mirror, behind the HTTP door
(server/mirror/): manifests and blobs asked of any repository, answered
from the store, what it lacks fetched from the upstream registry.

What is mirrored is kept as a carton per image manifest: its files are
``model/manifest.json`` (the manifest's bytes, so the blob keyed by the
manifest's digest is the manifest) and ``model/blobs/sha256/<hex>`` for
its config and layers, each recorded with the registry URL it came from.
The collector sees a model like any other: the same budget, the same LRU
(each manifest served touches it), blobs evicted and fetched again from
their recorded URL. Its source is the reference it was asked by (a tag
or a digest), so a tag is answered from the store when the upstream
registry cannot be reached. An index (a multi-platform list) is kept the
same way with no blobs; its platforms' manifests, asked next, each get
their own carton. A blob asked outside any manifest is committed alone
and kept as the store keeps any unreferenced blob (gc.grace).

A manifest's blobs are fetched when the manifest is first asked for
(GET), in the background: the manifest is answered at once, and each of
its blobs is streamed to whoever asks for it while it arrives
(arriving.py), its last byte sent once the blob is verified; the carton
is committed when all of them are. A blob the store holds is served from
its file (sendfile, Range); a Range on a blob still arriving waits for it
to be committed. Each blob is fetched from upstream once, whatever the
number of callers asking at once, the manifests naming it included (one
fetch per blob digest). HEAD of a blob the store lacks asks upstream's
HEAD: it never starts a download.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from cartonstore.carton.checks import check_carton
from cartonstore.carton.from_files import ListedFile, files_carton
from cartonstore.errors import FetchError, FetchNotFound, InvalidInput, NotFound
from cartonstore.fetch.transfer.download import fetch_blob
from cartonstore.format.carton_toml import SHORT_DESCRIPTION_MAX
from cartonstore.format.digest import is_sha256
from cartonstore.store.content.blobs import BlobWriter, StagedBlob
from cartonstore.store.ingest import Staging
from cartonstore.system.single_flight import all_or_none

from .arriving import Arriving
from .artifact import MAX_MANIFEST_SIZE, OCI_INDEX, OCI_MANIFEST
from .reference import OciReference
from .registry import Registry

if TYPE_CHECKING:
    from cartonstore.fetch.puller import Puller

T = TypeVar("T")
log = logging.getLogger("cartonstore.oci")
MANIFEST_FILE = "manifest.json"
BLOB_FOLDER = "blobs/sha256/"


@dataclasses.dataclass(frozen=True)
class Manifest:
    raw: bytes
    media_type: str
    digest: str   # "sha256:<hex>"


def manifest_descriptors(raw: bytes, where: str) -> tuple[str, dict[str, int]]:
    """The media type a manifest says it is and the blobs it names (hex ->
    size): its config and layers; none for an index (its entries are
    manifests, asked by digest on their own). Pure."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise InvalidInput(f"{where}: the manifest is not JSON ({e})", subject=where) from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"{where}: the manifest is not a JSON object", subject=where)
    return descriptors_of(doc, where)


def descriptors_of(doc: dict[str, Any], where: str) -> tuple[str, dict[str, int]]:
    """manifest_descriptors of a manifest already parsed."""
    media_type = doc.get("mediaType") if isinstance(doc.get("mediaType"), str) else ""
    if "manifests" in doc:
        return media_type or OCI_INDEX, {}
    blobs: dict[str, int] = {}
    for descriptor in ([doc.get("config")] if doc.get("config") else []) + list(doc.get("layers") or []):
        digest, size = (descriptor.get("digest"), descriptor.get("size")) if isinstance(descriptor, dict) else (0, 0)
        if not isinstance(digest, str) or not digest.startswith("sha256:") or not is_sha256(digest[7:]) \
                or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(f"{where}: a descriptor of the manifest is not a sha256 digest with a size: "
                               f"{str(descriptor)[:200]}", subject=where)
        if blobs.setdefault(digest[7:], size) != size:
            raise InvalidInput(f"{where}: the manifest gives blob {digest} two sizes", subject=where)
    return media_type or OCI_MANIFEST, blobs


class PullThrough:
    """Manifests and blobs of any upstream repository, through the store."""

    def __init__(self, puller: Puller, default_upstream: str = "", tag_ttl: float = 30.0) -> None:
        self.puller = puller
        self.default_upstream = default_upstream
        self.tag_ttl = tag_ttl
        self._tags: dict[tuple[str, str, str], tuple[float, Manifest]] = {}
        self._flights: dict[tuple[str, ...], asyncio.Future] = {}
        self._arriving: dict[str, Arriving] = {}   # blob hex digest -> its fetch, until committed or failed
        self._keeping: dict[tuple[str, str], tuple[Manifest, asyncio.Task]] = {}   # (manifest digest, source)
        self._tasks: set[asyncio.Task] = set()

    def _own(self, work: Awaitable[None], what: str) -> asyncio.Task:
        """Work that goes on after the request that started it is answered
        (or gone); its failure is logged, and close() stops it."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("mirror: %s failed: %s", what, getattr(t.exception(), "message", t.exception()))

        task.add_done_callback(done)
        return task

    async def close(self) -> None:
        """Stop the fetches under way; what they staged is discarded."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def authority(self, ns: str | None) -> str:
        """The upstream registry of a request: ``?ns=`` as containerd sends
        it, else mirror.upstream."""
        authority = ns or self.default_upstream
        if not authority:
            raise InvalidInput("no upstream registry: the request has no ?ns= and mirror.upstream is not set",
                               subject="ns")
        return authority

    def _registry_of(self, ref: OciReference) -> Registry:
        return Registry(self.puller.client, ref, self.puller.fetcher.mirrors_passed_over)

    async def _once(self, key: tuple[str, ...], work: Callable[[], Awaitable[T]]) -> T:
        """One flight per key: callers asking at once share its outcome."""
        if key in self._flights:
            return await asyncio.shield(self._flights[key])
        future: asyncio.Future = asyncio.ensure_future(work())
        self._flights[key] = future
        try:
            return await asyncio.shield(future)
        finally:
            if future.done():
                self._flights.pop(key, None)
            else:
                future.add_done_callback(lambda _f: self._flights.pop(key, None))

    # -- manifests -----------------------------------------------------------

    async def manifest(self, ns: str | None, repository: str, reference: str, *, head: bool) -> Manifest:
        """The manifest ``reference`` (a tag or "sha256:...") names. By
        digest: the store's copy once held. By tag: upstream's answer (tags
        move), kept tag_ttl seconds; the store's last one when upstream
        cannot be reached. A GET (not ``head``) starts keeping it and its
        blobs in the store, in the background (the module's docstring)."""
        authority = self.authority(ns)
        by_digest = reference.startswith("sha256:")
        if by_digest and not is_sha256(reference[7:]):
            raise InvalidInput(f"{reference!r} is not a sha256 digest", subject=reference)
        if by_digest and (held := await asyncio.to_thread(self._held_by_digest, reference)) is not None:
            return held
        if by_digest and (kept := self._kept_now(reference)) is not None:
            return kept
        if by_digest:
            ref = OciReference(authority, repository, digest=reference)
            manifest = Manifest(*await self._once(("manifest", authority, repository, reference),
                                                  lambda: self._registry_of(ref).get_manifest()))
        else:
            manifest = await self._tagged(authority, repository, reference)
        if not head:
            source = f"oci://{authority}/{repository}" + (f"@{reference}" if by_digest else f":{reference}")
            _type, blobs = manifest_descriptors(manifest.raw, source)   # a bad manifest is refused, not answered
            key = (manifest.digest, source)
            if key not in self._keeping:
                task = self._own(self._keep(authority, repository, manifest, blobs, source), f"keeping {source}")
                self._keeping[key] = (manifest, task)
                task.add_done_callback(lambda _t: self._keeping.pop(key, None))
        return manifest

    def _kept_now(self, digest: str) -> Manifest | None:
        """A manifest being kept (its carton not yet committed)."""
        return next((m for (d, _s), (m, _t) in self._keeping.items() if d == digest), None)

    async def _kept_by_source(self, source: str) -> None:
        """Wait for the keeping of ``source`` under way, if any (whatever its outcome)."""
        tasks = [t for (_d, s), (_m, t) in self._keeping.items() if s == source]
        if tasks:
            await asyncio.wait(tasks)

    async def _tagged(self, authority: str, repository: str, tag: str) -> Manifest:
        key = (authority, repository, tag)
        cached = self._tags.get(key)
        if cached is not None and time.monotonic() - cached[0] < self.tag_ttl:
            return cached[1]
        ref = OciReference(authority, repository, tag=tag)
        try:
            raw, media_type, digest = await self._once(
                ("tag", *key), lambda: self._registry_of(ref).get_manifest())
        except FetchNotFound:
            raise
        except FetchError:
            await self._kept_by_source(f"oci://{authority}/{repository}:{tag}")
            held = await asyncio.to_thread(self._held_by_source, f"oci://{authority}/{repository}:{tag}")
            if held is None:
                raise
            return held
        manifest = Manifest(raw, media_type, digest)
        self._tags[key] = (time.monotonic(), manifest)
        return manifest

    def _held_by_digest(self, digest: str) -> Manifest | None:
        """The stored blob of ``digest`` when it is a manifest; None when the
        store holds none, or a blob that is no manifest (a layer, a config):
        a caller cannot have any blob answered as a manifest, nor a big one
        read to find out."""
        try:
            with open(self.puller.store.blobs.path(digest[7:]), "rb") as f:
                raw = f.read(MAX_MANIFEST_SIZE + 1)
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw) if len(raw) <= MAX_MANIFEST_SIZE else None
        except ValueError:
            return None
        if not isinstance(doc, dict) or doc.get("schemaVersion") != 2 or not ("layers" in doc or "manifests" in doc):
            return None
        media_type, _blobs = descriptors_of(doc, digest)
        return Manifest(raw, media_type, digest)

    def _held_by_source(self, source: str) -> Manifest | None:
        """The manifest last kept for ``source``, its carton counted as used now (LRU)."""
        index = self.puller.store.index
        row = index.carton_for_source(source)
        if row is None:
            return None
        index.touch(row.digest)
        entry = next((e for e in index.entries(row.digest) if e.path == f"model/{MANIFEST_FILE}"), None)
        return self._held_by_digest(f"sha256:{entry.digest}") if entry is not None else None

    async def _keep(self, authority: str, repository: str, manifest: Manifest, blobs: dict[str, int],
                    source: str) -> None:
        """The manifest and its blobs in the store as one carton (see the
        module's docstring); what the store has is not fetched again, and a
        blob being fetched already is waited for, not fetched twice."""
        store = self.puller.store
        held = await asyncio.to_thread(self._held_by_source, source)
        if held is not None and held.digest == manifest.digest:
            return
        registry = self._registry_of(OciReference(authority, repository))
        staging = Staging(store.blobs)
        fetches: list[Arriving] = []
        try:
            files = {MANIFEST_FILE: ListedFile(manifest.digest[7:], len(manifest.raw)),
                     **{BLOB_FOLDER + d: ListedFile(d, size) for d, size in blobs.items()}}
            model_name = f"mirror/{authority}/{repository}"
            carton = files_carton(model_name, files, origin=source, description=_described(source))
            await asyncio.to_thread(check_carton, carton.view(source), links_raw=b"")   # before any blob is fetched
            await asyncio.to_thread(staging.add_small, {MANIFEST_FILE: manifest.raw})
            missing = await asyncio.to_thread(lambda: [d for d in blobs if not store.blobs.has(d)])
            waits: list[Awaitable] = []
            for digest in missing:   # in one step of the loop: nobody starts one of these meanwhile
                if digest in self._arriving:
                    waits.append(asyncio.shield(self._arriving[digest].finished))
                    continue
                arriving, fetch = self._start(registry, digest, blobs[digest])
                fetches.append(arriving)
                waits.append(self._stage(staging, fetch))
            await all_or_none(waits)
            await registry.connect()
            links: dict[str, tuple[str, ...]] = {d: (registry.source_url(d),) for d in blobs}
            await asyncio.to_thread(store.commit_files_carton, carton, staging, model_name=model_name, origin=source,
                                    links=links, kind="oci", name=None, source=source, force=False, read_files=False)
        except BaseException as e:
            staging.discard()
            for arriving in fetches:
                arriving.end(e)
            raise
        for arriving in fetches:
            arriving.end(None)

    @staticmethod
    async def _stage(staging: Staging, fetch: asyncio.Future[StagedBlob]) -> None:
        staging.add_staged(await fetch)   # staged as each arrives: a failure discards them all

    # -- blobs ---------------------------------------------------------------

    def _start(self, registry: Registry, digest: str, size: int | None) -> tuple[Arriving, asyncio.Task[StagedBlob]]:
        """Fetch blob ``digest``, read by callers as it lands; listed in
        self._arriving until its owner ends it (committed, or failed)."""
        arriving = Arriving(digest, size, self.puller.store.blobs.path(digest))
        self._arriving[digest] = arriving
        fetch = asyncio.ensure_future(self._fetch(registry, digest, size, watch=arriving.watch))
        fetch.add_done_callback(arriving.fetched)
        arriving.finished.add_done_callback(lambda _f: self._arriving.pop(digest, None)
                                            if self._arriving.get(digest) is arriving else None)
        return arriving, fetch

    async def blob(self, ns: str | None, repository: str, digest: str) -> Path | Arriving:
        """Blob ``digest`` ("sha256:<hex>"): its stored file, or its fetch
        from upstream under way (started here when none is), committed alone
        when verified unless a manifest's carton is fetching it."""
        hex_digest = _hex_of(digest)
        store = self.puller.store
        if await asyncio.to_thread(store.blobs.has, hex_digest):
            return store.blobs.path(hex_digest)
        if hex_digest in self._arriving:
            return self._arriving[hex_digest]
        registry = self._registry_of(OciReference(self.authority(ns), repository))
        arriving, fetch = self._start(registry, hex_digest, None)

        async def commit_alone() -> None:
            try:
                await asyncio.to_thread(store.blobs.commit, await fetch)
            except BaseException as e:
                arriving.end(e)
                raise
            arriving.end(None)

        self._own(commit_alone(), f"fetching blob {digest}")
        return arriving

    async def stored_blob(self, ns: str | None, repository: str, digest: str) -> Path:
        """Blob ``digest``'s stored file, after its fetch (if one is needed) is committed."""
        for attempt in range(2):   # a second time, alone, where its manifest's carton failed for another blob
            found = await self.blob(ns, repository, digest)
            if isinstance(found, Path):
                return found
            await asyncio.wait([found.finished])
            failure = found.finished.exception()
            if failure is None:
                return found.stored_path
            if attempt or (found.verified.done() and found.verified.exception() is not None):
                raise failure
        raise AssertionError("unreachable")

    async def blob_size(self, ns: str | None, repository: str, digest: str) -> int:
        """Blob ``digest``'s size without fetching it: the store's, its
        manifest's while it arrives, else what upstream's HEAD says."""
        hex_digest = _hex_of(digest)
        size = await asyncio.to_thread(self.puller.store.blobs.size_if_present, hex_digest)
        arriving = self._arriving.get(hex_digest)
        if size is None and arriving is not None:
            size = arriving.size
        if size is not None:
            return size
        registry = self._registry_of(OciReference(self.authority(ns), repository))
        await registry.connect()
        size = await registry.blob_size(hex_digest, push=False)
        if size is None:
            raise NotFound(f"blob {digest} is not in the store nor at {registry.ref.authority}/"
                           f"{registry.ref.repository}", subject=hex_digest)
        return size

    async def _fetch(self, registry: Registry, digest: str, size: int | None,
                     watch: Callable[[BlobWriter], None]) -> StagedBlob:
        """The blob from upstream, verified by its digest (and size, when
        known) and staged, resumed by Range where the connection breaks."""
        await registry.connect()
        try:
            return await fetch_blob(self.puller.client, self.puller.store.blobs, digest, [registry.blob_url(digest)],
                                    self.puller.config, stats=self.puller.stats, kind_of=lambda _u: "registry",
                                    expected_size=size, watch=watch)
        except FetchNotFound:
            raise NotFound(f"blob sha256:{digest} is not in the store nor at {registry.ref.authority}/"
                           f"{registry.ref.repository}", subject=digest) from None


def _described(source: str) -> str:
    """A kept manifest's short description: its source, cut to the length
    a carton.toml allows (a reference by digest alone is longer)."""
    text = f"mirrored {source}"
    return text if len(text) <= SHORT_DESCRIPTION_MAX else text[:SHORT_DESCRIPTION_MAX - 3] + "..."


def _hex_of(digest: str) -> str:
    if not digest.startswith("sha256:") or not is_sha256(digest[7:]):
        raise InvalidInput(f"{digest!r} is not a sha256 digest", subject=digest)
    return digest[7:]


__all__ = ["Manifest", "PullThrough", "manifest_descriptors"]
