"""Puller: the store plus the network. Adds cartons by URL, completes
cartons whose blobs are missing, and materializes them.

Everything here is async; store work (hashing, SQLite, renames) runs in
worker threads. One Puller serves one process: the CLI makes one per
command, the daemon one for its lifetime.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cartonstore.carton.checks import CheckedCarton, check_carton
from cartonstore.errors import (
    CartonStoreError,
    FetchError,
    IntegrityError,
    ManifestMismatch,
    NotFound,
)
from cartonstore.fetch.http.client import HttpClient
from cartonstore.fetch.http.config import FetchConfig
from cartonstore.fetch.http.policy import describe
from cartonstore.fetch.http.source_kinds import SourceKind, SourceKinds
from cartonstore.fetch.sources.local_files import restore_from_local
from cartonstore.fetch.sources.peers import ORIGIN, Claim, offer
from cartonstore.fetch.sources.remote_zip import RemoteCartonView, open_remote_zip, prefetch_view, read_entries
from cartonstore.fetch.transfer.download import download, stage_to_the_end
from cartonstore.fetch.transfer.stats import SOURCE_KINDS, TransferStats
from cartonstore.format.units import format_size
from cartonstore.store import Store
from cartonstore.store.content.blobs import BlobWriter
from cartonstore.store.ingest import IngestResult, Provenance, Staging, check_staged_safetensors
from cartonstore.store.metadata.names import NameOutcome, validate_name
from cartonstore.store.root.locks import async_file_lock
from cartonstore.system.single_flight import SingleFlight, all_or_none
from cartonstore.zipfmt import ZipEntry

from .blob_fetcher import BlobFetcher
from .holds import holding
from .metadata_refetch import mend_small_files

if TYPE_CHECKING:
    from cartonstore.store.metadata.index import CartonRow
    from cartonstore.system.callers import Credentials


def is_url(text: str) -> bool:
    return "://" in text


def is_local_source(text: str) -> bool:
    """Whether add() reads text as a path on this host: every other source
    (a carton URL, an OCI reference) is written SCHEME://..."""
    return not is_url(text)


@dataclass(frozen=True)
class PullResult:
    digest: str
    name: str | None
    complete: bool
    blobs_fetched: int
    bytes_received: int
    requests: int
    bytes_reused: int = 0   # bytes of the carton the store already had
    naming: NameOutcome | None = None  # what the add did to the name (moved, kept by another)
    bytes_read: int = 0     # taken from a local carton file or directory
    retries: int = 0
    sources: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> {"bytes", "blobs"}
    local: bool = False     # added from a local file or directory (else by URL)

    def counts(self) -> dict:
        """What the add moved, for --json: blobs_fetched are the blobs the
        store lacked and now holds, from whichever source."""
        return {"blobs_fetched": self.blobs_fetched, "bytes_received": self.bytes_received,
                "bytes_read": self.bytes_read, "bytes_reused": self.bytes_reused, "requests": self.requests,
                "retries": self.retries, "sources": self.sources}

    def summary(self) -> str:
        """What happened, in words: "read 40.0 MiB from disk, ..." or
        "received 40.0 MiB in 4 request(s), ..."."""
        said = []
        if self.local:
            said.append(f"read {format_size(self.bytes_read)} from disk")
        if self.requests or not self.local:
            moved = {k: v["bytes"] for k, v in self.sources.items() if k != "file" and v["bytes"]}
            by = f" ({', '.join(f'{k} {format_size(n)}' for k, n in moved.items())})" if set(moved) - {"url"} else ""
            said.append(f"received {format_size(self.bytes_received)} in {self.requests} request(s){by}")
        if self.retries:
            said.append(f"{self.retries} retr{'y' if self.retries == 1 else 'ies'}")
        said.append(f"{self.blobs_fetched} new blob(s)")
        said.append(f"{format_size(self.bytes_reused)} already stored")
        return ", ".join(said)


class Puller:
    def __init__(self, store: Store, config: FetchConfig | None = None, *, sources: SourceKinds,
                 on_event: Callable[[dict], None] | None = None) -> None:
        """``sources``: what it reads besides local paths (``CARTON_URL``
        below; config/pulling.py's standard set adds OCI) and what answers a
        401; ``on_event`` is told of cartons read, names moved and retries;
        ``stats`` counts what moves, for progress to read at its own pace."""
        self.store = store
        self.config = config or FetchConfig()
        self.sources = sources
        self.on_event = on_event or (lambda _e: None)
        self.client = HttpClient(self.config, answerer=sources.answerer)
        self.fetcher = BlobFetcher(store, self.client, self.config, stats=TransferStats(on_event=self.on_event))
        self._urls_in_flight = SingleFlight()

    async def __aenter__(self) -> Puller:
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__(*exc)

    @property
    def stats(self) -> TransferStats:
        return self.fetcher.stats

    # -- adding ----------------------------------------------------------------

    async def add(self, source: str, *, name: str | None = None, lazy: bool = False,
                  force: bool = False, confined: bool = False, caller: Credentials | None = None,
                  on_committed: Callable[[str], None] | None = None) -> PullResult:
        """Add a carton from a URL or a local path; unless lazy, fetch every
        blob it lacks (LINKS, mirrors) before returning. Naming follows
        Store.add (an explicit name may move, unless loaded and not force);
        a local path is read with ``caller``'s rights where given (Store.add).
        ``on_committed(digest)``: the carton is in the index (its carton.toml
        readable), before the blobs it lacks, if any, are fetched."""
        if name is not None:
            validate_name(name)
        before = self.stats.snapshot()
        read = [0, 0]   # bytes, blobs taken from a local source
        if is_url(source):
            result = await self._add_kind(self.sources.claimed(source), source, name, force, lazy)
        else:
            result = await asyncio.to_thread(self.store.add, source, name=name, force=force, confined=confined,
                                             caller=caller)
            read = [result.bytes_added, result.blobs_added]
        if result.naming is not None and (note := result.naming.note(result.digest)):
            self.on_event({"event": "name", "message": note, **result.naming.as_json()})
        if not lazy:  # blobs a collection evicted meanwhile come back from their local source
            if on_committed is not None:
                on_committed(result.digest)
            await self.complete(result.digest)
        missing = await asyncio.to_thread(self.store.missing_blobs, result.digest)
        moved = self.stats.since(before)
        sources = {k: {"bytes": moved["source_bytes"].get(k, 0), "blobs": moved["source_blobs"].get(k, 0)}
                   for k in SOURCE_KINDS}
        # The add's own reads, and the blobs complete() restored from their local sources.
        sources["file"] = {"bytes": read[0] + sources["file"]["bytes"], "blobs": read[1] + sources["file"]["blobs"]}
        return PullResult(result.digest, result.name, not missing, sum(v["blobs"] for v in sources.values()),
                          moved["bytes_received"], moved["requests"], result.bytes_reused, result.naming,
                          bytes_read=sources["file"]["bytes"], retries=moved["retries"], sources=sources,
                          local=not is_url(source))

    async def _add_kind(self, kind: SourceKind, text: str, name: str | None, force: bool,
                        lazy: bool) -> IngestResult:
        """A source of one of the kinds this puller reads, added once at a
        time across processes (one lock per canonical ref)."""
        ref = kind.canonical(self, text)
        return await self._urls_in_flight.run(f"{ref}\n{name}\n{force}\n{lazy}",
                                              lambda: self._add_kind_once(kind, ref, name, force, lazy))

    async def _add_kind_once(self, kind: SourceKind, ref: str, name: str | None, force: bool,
                             lazy: bool) -> IngestResult:
        started = time.time()
        lock = self.store.layout.locks_dir / f"url-{hashlib.sha256(ref.encode()).hexdigest()}.lock"
        async with async_file_lock(lock, timeout=self.config.lock_timeout):
            # Another process added this source while we queued: share its work.
            row = await asyncio.to_thread(self.store.index.carton_for_source, ref)
            if row is not None and row.added_at >= started:
                naming = await asyncio.to_thread(self.store.name_carton, row.digest, name, force=force)
                return IngestResult(row.digest, naming.name, True, 0, 0, 0, naming)
            self.on_event({"event": "carton", "url": describe(ref)})
            return await kind.add(self, ref, name, force, lazy)

    async def add_from_url(self, url: str, name: str | None, force: bool, _lazy: bool = False) -> IngestResult:
        """A carton URL's add (CARTON_URL): its zip read by ranges, or
        downloaded whole where the server ignores Range (every blob the
        store lacks comes from the zip: lazy or not, as reading it is one)."""
        rz = await open_remote_zip(self.client, url, self.config, self.store.zip_limits, self.stats)
        if rz is None:
            return await self._add_whole_download(url, name, force)
        view = await prefetch_view(self.client, rz, self.config, self.stats)
        await mend_small_files(view, self.fetcher)
        checked = await asyncio.to_thread(check_carton, view)
        return await self._stage_and_commit(checked, view, url, name=name, force=force)

    async def _add_whole_download(self, url: str, name: str | None, force: bool) -> IngestResult:
        """The server ignores Range: stream the carton once into tmp/ and add it."""
        self.on_event({"event": "whole-download", "url": describe(url)})
        with self.store.blobs.writer(label="carton") as w:
            await download(self.client, url, w, self.config, stats=self.stats)
            result = await asyncio.to_thread(self.store.add, w.tmp_path, name=name, source_label=url, force=force,
                                             provenance=Provenance("url", whole=True))
            self.stats.blobs("url", result.blobs_added)
            return result

    async def _stage_and_commit(self, checked: CheckedCarton, view: RemoteCartonView, url: str, *,
                                name: str | None, force: bool = False) -> IngestResult:
        """Stage what the store lacks (from peers, else the zip) and commit
        the carton; its blobs stay claimed (peers.py) until they are in."""
        async with self.fetcher.peers.claiming(checked.files_by_digest()) as claims:
            staging, elsewhere = await self._stage_remote(checked, view, claims)
            result = await asyncio.to_thread(self.store.commit_checked, checked, staging, name=name,
                                             source=url, force=force, provenance=Provenance("url"))
        self.stats.blobs("url", result.blobs_added - elsewhere)
        return result

    async def _stage_remote(self, checked: CheckedCarton, view: RemoteCartonView,
                            claims: dict[str, Claim]) -> tuple[Staging, int]:
        """Stage the blobs the store lacks from peers that have them, else
        from the remote zip (small files are already in memory); verify each
        against MANIFEST. Also returns how many came from elsewhere than the
        zip (counted there)."""
        peers = self.fetcher.peers
        staging = Staging(self.store.blobs)
        try:
            await asyncio.to_thread(self._stage_small, checked, view, staging)
            for digest, staged in staging.staged.items():
                offer(claims, digest, staged.tmp_path)
            lacking = await asyncio.to_thread(lambda: [d for d in checked.files_by_digest()
                                                       if d not in staging.staged and not self.store.blobs.has(d)])
            if not peers.urls:
                for claim in claims.values():
                    claim.stage = ORIGIN
                elsewhere = await self._stage_entries(checked, view, lacking, staging, claims)
            else:
                # Each blob on its own, from a peer or the zip, as soon as its peers have answered: a
                # node waiting on this one for some blob of the carton must not wait for all of them.
                slots = asyncio.Semaphore(self.config.max_concurrency)

                async def one(digest: str) -> int:
                    async with slots:
                        staged = await self.fetcher.stage_from_peer(digest, claims.get(digest))
                        if staged is None:
                            return await self._stage_entries(checked, view, [digest], staging, claims)
                    staging.add_staged(staged)
                    offer(claims, digest, staged.tmp_path)
                    return 1
                elsewhere = sum(await all_or_none(one(d) for d in lacking))
            await asyncio.to_thread(check_staged_safetensors, checked, staging)
            return staging, elsewhere + sum(1 for d in view.mended if d in staging.staged)
        except BaseException:
            staging.discard()
            raise

    async def _stage_entries(self, checked: CheckedCarton, view: RemoteCartonView, digests: list[str],
                             staging: Staging, claims: dict[str, Claim]) -> int:
        """Read these blobs' zip entries (neighbours merged into one request),
        verify and stage them; returns how many came from the blob's other
        sources instead (a zip entry that does not match MANIFEST)."""
        elsewhere = 0
        writers: dict[str, BlobWriter] = {}
        wanted_digests = set(digests)
        paths = {d: p for d, p in checked.files_by_digest().items() if d in wanted_digests}
        try:
            wanted: list[tuple[ZipEntry, Callable]] = []
            for digest, path in paths.items():
                def make(digest: str = digest) -> BlobWriter:
                    old = writers.pop(digest, None)
                    if old is not None:
                        old.close()
                    writers[digest] = self.store.blobs.writer(label="zip")
                    return writers[digest]
                wanted.append((view.rz.entries[path], make))
            broken = await read_entries(self.client, view.rz, wanted, self.config, self.stats)
            for digest, w in writers.items():
                problem = broken.get(paths[digest])   # corrupt on the way (CRC-32, sizes, compressed data)
                if problem is None:
                    try:
                        staged = await stage_to_the_end(w, expected_digest=digest)
                    except IntegrityError as e:
                        problem = e.message
                if problem is not None:   # the blob's other sources (LINKS, mirrors) may have it right
                    await asyncio.to_thread(w.close)   # its bytes are no use: not on disk beside a second copy
                    staged = await self.fetcher.stage_instead(paths[digest], digest, view.rz.url, problem,
                                                              checked.links.get(digest, ()))
                    elsewhere += 1
                staging.add_staged(staged)
                offer(claims, digest, staged.tmp_path)
            return elsewhere
        finally:
            for w in writers.values():
                w.close()

    @staticmethod
    def _stage_small(checked: CheckedCarton, view: RemoteCartonView, staging: Staging) -> None:
        if not staging.blobs.has(checked.digest):
            staging.add_bytes(checked.manifest.raw, checked.digest)
        for digest, path in checked.files_by_digest().items():
            data = view.prefetched(path)
            if data is not None and not staging.blobs.has(digest):
                try:
                    staging.add_bytes(data, digest)
                except IntegrityError as e:
                    raise ManifestMismatch(path, e.message) from None

    # -- completing --------------------------------------------------------------

    async def complete(self, digest: str) -> int:
        """Fetch every missing blob of a known carton (its local sources,
        LINKS URLs, mirrors, the carton's own remote zip), held against
        eviction meanwhile (holds.py). Returns how many were fetched."""
        if not await asyncio.to_thread(self.store.missing_blobs, digest):
            return 0
        async with holding(self.store, digest, "completing"):
            return await self._complete_held(digest)

    async def _complete_held(self, digest: str) -> int:
        # Looked at again under the hold: a collection may have taken more meanwhile.
        missing = await asyncio.to_thread(self.store.missing_blobs, digest)
        if not missing:
            return 0
        # The local files they were added from first (fetch/sources/local_files.py), then the network.
        restored, local_reasons = await asyncio.to_thread(restore_from_local, self.store, missing,
                                                          self.fetcher.commit, lock_timeout=self.config.lock_timeout)
        self.stats.read_locally(sum(restored.values()), len(restored))   # read from disk, like a local add's
        fetched = len(restored)
        missing, row, unlinked = await asyncio.to_thread(self._still_missing, digest, missing)
        # A carton from a registry has every blob linked (and a collection keeps its MANIFEST).
        if unlinked and row is not None and row.source and CARTON_URL.claims(row.source):
            # In the carton's own zip, not in LINKS: read them from there again.
            fetched += await self._refetch_from_zip(row.source, digest, set(unlinked))
        linked, sourceless = await asyncio.to_thread(self._with_no_source, missing)
        if sourceless:
            why = "".join(f"; {r}" for r in list(dict.fromkeys(
                r for d in sourceless for r in local_reasons.get(d, ())))[:3])
            raise NotFound(f"carton {digest} is missing {len(sourceless)} blob(s) with no known source "
                           f"(e.g. {sourceless[0]}){why}; add it again from a source that holds them",
                           subject=digest)
        results = await asyncio.gather(*(self.fetcher.ensure(d) for d in linked), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for r in errors:
            if not isinstance(r, CartonStoreError):
                raise r
        if errors:
            detail = "\n".join(str(e) for e in errors[:5])
            raise FetchError(f"could not complete carton {digest}: {len(errors)} blob(s) failed\n{detail}",
                             subject=digest)
        return fetched + sum(1 for r in results if r is True)

    def _still_missing(self, digest: str, missing: list[str]) -> tuple[list[str], CartonRow | None, list[str]]:
        """In a thread (a stat per blob, SQLite per blob): those of missing the
        store still lacks, the carton's row, and those of them no LINKS lists."""
        left = [d for d in missing if not self.store.blobs.has(d)]
        return left, self.store.index.carton(digest), [d for d in left if not self.store.index.links_for(d)]

    def _with_no_source(self, missing: list[str]) -> tuple[list[str], list[str]]:
        """In a thread: those of missing still lacking, and those of them no URL can bring."""
        left = [d for d in missing if not self.store.blobs.has(d)]
        return left, [d for d in left if not self.fetcher.sources_for(d)]

    async def _refetch_from_zip(self, url: str, digest: str, wanted: set[str]) -> int:
        """Blobs evicted after an add by URL come back from the same zip."""
        rz = await open_remote_zip(self.client, url, self.config, self.store.zip_limits, self.stats)
        if rz is None:
            await self._add_whole_download(url, None, False)
            return len(wanted)
        view = await prefetch_view(self.client, rz, self.config, self.stats)
        await mend_small_files(view, self.fetcher)
        checked = await asyncio.to_thread(lambda: check_carton(view, top_level=False))
        if checked.digest != digest:
            raise FetchError(f"{describe(url)} now serves a different carton ({checked.digest}, not {digest})",
                             subject=url)
        await self._stage_and_commit(checked, view, url, name=None)
        return len(wanted)

    # -- materializing -------------------------------------------------------------

    async def materialize(self, ref: str, *, local: bool = True) -> Path:
        """Resolve REF (adding it first when it is a source), fetch what is
        missing, and return the model directory. ``local``: REF may be a path
        on this host, read with this process's rights (the daemon passes
        False: it reads a caller's path only as that caller, ModelService)."""
        try:
            digest = await asyncio.to_thread(self.store.resolve, ref)
        except NotFound:
            if not is_url(ref) and (not local or not Path(ref).exists()):
                raise
            digest = (await self.add(ref)).digest
        if (ready := await asyncio.to_thread(self.store.materialized, digest)) is not None:
            return ready
        if self.store.layout.model_path(digest).is_dir():  # built, but blobs are missing: fetch them back
            await self.complete(digest)
            return await asyncio.to_thread(self.store.materialize, digest)
        async with holding(self.store, digest, "materializing"):  # nothing evicted before the build
            await self._complete_held(digest)
            return await asyncio.to_thread(self.store.materialize, digest)


CARTON_URL = SourceKind("url", ("http", "https"), lambda puller, url: puller.config.policy.check(url),
                        Puller.add_from_url)
"""A carton's zip at an http(s) URL, read by ranges (fetch's own kind)."""
