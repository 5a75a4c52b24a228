"""One download per blob: in-process single-flight plus a cross-process lock.

Concurrent callers asking for the same digest (tasks of this process, or
other processes on the same store root) share one download: tasks await
the same future, processes queue on ROOT/locks/blob-<digest>.lock and
find the blob present once the holder commits it. Peers that have the blob
(peers.py) are asked before any of its sources.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from dataclasses import replace

from cartonstore.carton.checks import check_safetensors, is_safetensors
from cartonstore.errors import CartonStoreError, ManifestMismatch
from cartonstore.fetch.http.client import HttpClient
from cartonstore.fetch.http.config import FetchConfig
from cartonstore.fetch.http.policy import describe
from cartonstore.fetch.sources.mirrors import stage_from_mirrors
from cartonstore.fetch.sources.peers import ORIGIN, Claim, PeerSet
from cartonstore.fetch.sources.registry_mirrors import mirrored_blob_urls, pulled_from, registry_of
from cartonstore.fetch.transfer.download import SourcesFailed, fetch_blob
from cartonstore.fetch.transfer.stats import TransferStats
from cartonstore.store import Store
from cartonstore.store.content.blobs import StagedBlob
from cartonstore.store.metadata.source_bytes import SourceBytes
from cartonstore.store.root.locks import async_file_lock
from cartonstore.system.pass_over import PassOver
from cartonstore.system.single_flight import SingleFlight

log = logging.getLogger("cartonstore.fetch")


class BlobFetcher:
    def __init__(self, store: Store, client: HttpClient, config: FetchConfig, *,
                 stats: TransferStats | None = None) -> None:
        self.store = store
        self.client = client
        self.config = config
        self.stats = stats if stats is not None else TransferStats()
        self._flights = SingleFlight()
        self._slots = asyncio.Semaphore(config.max_concurrency)
        self.peers = PeerSet(config.peers, client)
        # registries' mirrors that failed lately (pulls share it)
        self.mirrors_passed_over = PassOver(config.registries.mirror_down_for)

    def sources_for(self, digest: str, urls: Sequence[str] = ()) -> list[str]:
        """LINKS URLs given, then those in the index, then each mirror."""
        known = list(dict.fromkeys([*urls, *self.store.index.links_for(digest)]))
        return known + [u for u in self._mirror_urls(digest) if u not in known]

    def carton_named(self, digest: str, sources: Sequence[str]) -> frozenset[str]:
        """Those of ``sources`` (sources_for's) that a carton named, held to
        policy.check_link: all but each mirror's and those of the registry
        repositories a caller pulled a carton of this blob from (the index
        keeps both kinds of URL alike, and a carton's LINKS may copy a
        registry's shape), and those at the Hugging Face endpoint the
        operator configured (fetch.hub). SQLite: in a thread."""
        mirrors = set(self._mirror_urls(digest))
        pulled = self.store.index.sources_of_blob(digest)
        return frozenset(u for u in sources if u not in mirrors and not pulled_from(u, pulled)
                         and not self.config.hub.serves(u))

    def _mirror_urls(self, digest: str) -> list[str]:
        return [f"{m.rstrip('/')}/{digest}" for m in self.config.mirrors]

    def kind_of(self, url: str) -> str:
        """"mirror" for <mirror>/<sha256>, "registry" for an OCI registry's
        .../v2/<repo>/blobs/sha256:<hex>, "peer" for a peer's, "hf" for the
        configured Hugging Face endpoint's, else "url" (a LINKS URL)."""
        if self.peers.is_peer_url(url):
            return "peer"
        if self.config.hub.serves(url):
            return "hf"
        head, _, tail = url.rpartition("/")
        mirrors = {m.rstrip("/") for m in self.config.mirrors}
        if head in mirrors and len(tail) == 64:
            return "mirror"
        return "registry" if "/v2/" in head and head.endswith("/blobs") and tail.startswith("sha256:") else "url"

    async def ensure(self, digest: str, urls: Sequence[str] = ()) -> bool:
        """Make the blob present; True if this call downloaded it."""
        if self.store.blobs.has(digest):
            return False
        return await self._flights.run(digest, lambda: self._fetch(digest, urls))

    async def _fetch(self, digest: str, urls: Sequence[str]) -> bool:
        lock = self.store.layout.locks_dir / f"blob-{digest}.lock"
        # Claimed before queueing: a peer asking meanwhile waits for this download rather than doing its own.
        async with self.peers.claiming([digest]) as claims, self._slots, \
                async_file_lock(lock, timeout=self.config.lock_timeout):
            if self.store.blobs.has(digest):  # another process got it while we waited
                return False
            staged = await self.stage_from_peer(digest, claims.get(digest))
            if staged is None:
                sources, named = await asyncio.to_thread(self._sources_and_named, digest, urls)  # SQLite: off the loop
                staged = await self._stage_from_registry_mirrors(digest, sources)
            if staged is None:
                staged = await fetch_blob(self.client, self.store.blobs, digest, sources, self.config,
                                          stats=self.stats, kind_of=self.kind_of, carton_named=named)
            try:
                await asyncio.to_thread(self._validate, staged)
                await asyncio.to_thread(self.commit, staged)
            finally:
                staged.discard()
            return True

    async def stage_from_peer(self, digest: str, claim: Claim | None, *,
                              expected_size: int | None = None) -> StagedBlob | None:
        """The blob staged from a peer that has it; None when no peer has it
        or the one that did failed to deliver (the caller goes to its
        sources, and the claim says so)."""
        url = await self.peers.locate(digest, claim)
        if url is None:
            return None
        try:
            return await fetch_blob(self.client, self.store.blobs, digest, [url], self.config, stats=self.stats,
                                    kind_of=lambda _u: "peer", expected_size=expected_size)
        except CartonStoreError as e:
            log.warning("blob %s from a peer failed, fetching it from its sources: %s", digest, e)
            if claim is not None:
                claim.stage = ORIGIN
            return None

    async def _stage_from_registry_mirrors(self, digest: str, sources: Sequence[str]) -> StagedBlob | None:
        """The blob from the mirrors ([registries.mirrors]) of the registries
        among ``sources``, as a pull asks them (fetch/sources/mirrors.py); None when
        none has it (the sources themselves are next, with their retries)."""
        mirrors = self.config.registries.mirrors
        for url in sources:
            urls = mirrored_blob_urls(url, mirrors)
            if urls:
                staged = await stage_from_mirrors(self.client, self.store.blobs, digest, urls, self.config,
                                                  self.mirrors_passed_over, registry=registry_of(url),
                                                  stats=self.stats)
                if staged is not None:
                    return staged
        return None

    async def stage_instead(self, path: str, digest: str, failed: str, problem: str,
                            urls: Sequence[str] = (), *, max_size: int | None = None) -> StagedBlob:
        """The bytes of ``path`` from source ``failed`` (a carton's URL) did not
        hash to ``digest``: stage the blob from its other sources (``urls``, the
        carton's LINKS for it, then the index's and each mirror) instead, at
        most ``max_size`` bytes from each. Raises ManifestMismatch naming every
        source tried and why it failed."""
        tried = [f"{describe(failed)}: {problem}"]
        sources, named = await asyncio.to_thread(self._sources_and_named, digest, urls)
        others = [u for u in sources if u != failed]
        if not others:
            raise ManifestMismatch(path, tried[0])
        try:
            config = self.config if max_size is None else replace(self.config, max_blob_size=max_size)
            return await fetch_blob(self.client, self.store.blobs, digest, others, config, stats=self.stats,
                                    kind_of=self.kind_of, carton_named=named)
        except SourcesFailed as e:
            tried += e.problems
        raise ManifestMismatch(path, f"no source delivered its bytes ({len(tried)} tried):\n  " + "\n  ".join(tried))

    def _sources_and_named(self, digest: str, urls: Sequence[str]) -> tuple[list[str], frozenset[str]]:
        sources = self.sources_for(digest, urls)
        return sources, self.carton_named(digest, sources)

    def _validate(self, staged: StagedBlob) -> None:
        """A blob is checked by the names cartons give it (safetensors headers)."""
        for path in self.store.index.paths_of_blob(staged.digest):
            if is_safetensors(path):
                check_safetensors(path, lambda: open(staged.tmp_path, "rb"), staged.size)  # noqa: SIM115 - the check closes it

    def commit(self, staged: StagedBlob) -> None:
        """Rename one blob into place and record it; one fetched (with an
        origin) counts in the store's figures in the same transaction."""
        figures = [SourceBytes(staged.origin, staged.size, 1)] if staged.origin is not None else []
        with self.store.lock():
            self.store.blobs.commit(staged)
            self.store.blobs.sync_dirs({staged.digest})
            self.store.index.record_blobs([(staged.digest, os.stat(self.store.blobs.path(staged.digest)).st_size)],
                                          figures=figures)

