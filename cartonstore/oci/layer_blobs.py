"""One add's layer blobs: staged from a peer, a mirror or the registry,
or read from the store (the carton's small files, a model's config)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from cartonstore.fetch.sources.mirrors import stage_from_mirrors
from cartonstore.fetch.sources.peers import Claim, offer
from cartonstore.fetch.transfer.download import fetch_blob
from cartonstore.store.content.blobs import StagedBlob
from cartonstore.store.ingest import Staging
from cartonstore.system.single_flight import all_or_none

from .registry import Registry

if TYPE_CHECKING:
    from cartonstore.fetch.puller import Puller


class LayerBlobs:
    """One add's blobs: staged from the registry, or found in the store."""

    def __init__(self, puller: Puller, registry: Registry, sizes: dict[str, int], staging: Staging,
                 claims: dict[str, Claim]) -> None:
        self.puller = puller
        self.registry = registry
        self.sizes = sizes
        self.staging = staging
        self.claims = claims
        self.slots = asyncio.Semaphore(puller.config.max_concurrency)

    async def stage(self, digest: str) -> Path:
        """Fetch the blob into staging (once), from a peer that has it, else
        the registry; returns its staged file."""
        if digest not in self.staging.staged:
            async with self.slots:
                staged = await self.puller.fetcher.stage_from_peer(digest, self.claims.get(digest),
                                                                   expected_size=self.sizes[digest])
                if staged is None:
                    staged = await self._from_mirrors(digest)
                if staged is None:
                    await self.registry.connect()   # once (a pull whose manifest a mirror served: now)
                    staged = await fetch_blob(self.puller.client, self.puller.store.blobs, digest,
                                              [self.registry.blob_url(digest)], self.puller.config,
                                              stats=self.puller.stats, kind_of=lambda _u: "registry",
                                              expected_size=self.sizes[digest])
            self.staging.add_staged(staged)
            offer(self.claims, digest, staged.tmp_path)
        return self.staging.staged[digest].tmp_path

    async def _from_mirrors(self, digest: str) -> StagedBlob | None:
        """The blob from the registry's mirrors (fetch/sources/mirrors.py), or None."""
        urls = [(endpoint, self.registry.mirror_url(endpoint, f"blobs/sha256:{digest}"))
                for endpoint in self.registry.mirrors]
        return await stage_from_mirrors(self.puller.client, self.puller.store.blobs, digest, urls,
                                        self.puller.config, self.registry.passed_over,
                                        registry=self.registry.ref.authority, stats=self.puller.stats,
                                        expected_size=self.sizes[digest])

    async def read(self, digest: str) -> bytes:
        """A small blob's bytes: the store's copy, else the registry's."""
        if digest not in self.staging.staged:
            try:
                return await asyncio.to_thread(self.puller.store.blobs.path(digest).read_bytes)
            except FileNotFoundError:
                pass
        return await asyncio.to_thread((await self.stage(digest)).read_bytes)

    async def stage_missing(self, digests: Iterable[str], *, lazy: bool) -> None:
        """Stage each of these blobs the store lacks, unless ``lazy``: then
        they come when first needed, from the sources recorded for them."""
        if lazy:
            return
        missing = await asyncio.to_thread(
            lambda: [d for d in digests if d not in self.staging.staged and not self.puller.store.blobs.has(d)])
        await all_or_none(self.stage(d) for d in missing)
