"""Asking a registry's mirrors for one blob ([registries.mirrors]): each
once, without retries (the registry is next, with its retries), and a
mirror that fails otherwise than by lacking the blob (unreachable, an
error status, bytes that are not the digest's) passed over for a while:
a pull of many blobs, or a node fetching many evicted blobs again, would
wait on a dead mirror's connect timeout once per blob otherwise. One rule
for a pull (cartonstore.oci) and for fetching an evicted blob again
(blob_fetcher.py). What a mirror brings counts as "mirror" and is reached
as the registry is (registries.proxy)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from cartonstore.errors import FetchError, IntegrityError, InvalidInput
from cartonstore.fetch.http.client import HttpClient
from cartonstore.fetch.http.config import FetchConfig
from cartonstore.fetch.http.policy import describe
from cartonstore.fetch.transfer.download import SourcesFailed, fetch_blob
from cartonstore.fetch.transfer.stats import TransferStats
from cartonstore.store.content.blobs import BlobStore, StagedBlob
from cartonstore.system.pass_over import PassOver

log = logging.getLogger("cartonstore.fetch")
_THE_MIRRORS = (FetchError, IntegrityError, InvalidInput)   # a mirror's faults; others (a full disk) are ours


def pass_over_mirror(passed_over: PassOver, endpoint: str, registry: str, why: str) -> None:
    """Ask mirror ``endpoint`` nothing for registries.mirror_down_for: it
    failed otherwise than by lacking what was asked."""
    if passed_over.add(endpoint):
        log.warning("mirror %s of %s: %s; not asked again for %g s", describe(endpoint), registry, why,
                    passed_over.period)


async def stage_from_mirrors(client: HttpClient, blobs: BlobStore, digest: str, urls: Sequence[tuple[str, str]],
                             config: FetchConfig, passed_over: PassOver, *, registry: str,
                             stats: TransferStats | None = None,
                             expected_size: int | None = None) -> StagedBlob | None:
    """The blob staged from the first of ``urls`` ((endpoint, URL) pairs,
    in order) that delivers it, skipping those ``passed_over``; None when
    none does."""
    once = dataclasses.replace(config, retries=0)
    for endpoint, url in urls:
        if endpoint in passed_over:
            continue
        try:
            return await fetch_blob(client, blobs, digest, [url], once, stats=stats, kind_of=lambda _u: "mirror",
                                    route="registry", expected_size=expected_size)
        except SourcesFailed as e:
            why = e.problems[0] if e.problems else e.message
            if e.none_had_it:
                log.info("blob %s: not at mirror %s; asking the next", digest[:12], describe(endpoint))
            elif all(isinstance(error, _THE_MIRRORS) for error in e.errors):
                pass_over_mirror(passed_over, endpoint, registry, why)
            else:
                log.warning("blob %s from mirror %s failed here: %s", digest[:12], describe(endpoint), why)
    return None
