"""Helpers for fetch tests: cartons served by an Origin, fast fetch settings."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conftest import MINIMAL_TOML, carton_entries, sha, work_in_tmp, write_zip

from cartonstore.fetch.http.config import FetchConfig
from cartonstore.fetch.http.policy import UrlPolicy
from cartonstore.fetch.http.source_kinds import SourceKinds
from cartonstore.fetch.puller import CARTON_URL, Puller, PullResult
from cartonstore.format.links import build_links
from cartonstore.store import Store

FAST = {"retries": 3, "backoff_base": 0.01, "backoff_max": 0.05, "stall_timeout": 0.5, "connect_timeout": 2.0}


# Tests serve the blobs a carton's LINKS name from origins on 127.0.0.1, which
# production refuses such URLs (fetch.allow_private_links): tests/fetch/test_private_links.py
# is where that refusal is tested, with policies of its own.
TEST_POLICY = UrlPolicy(allow_private_links=True)
# What fetch reads by itself: a Puller built with this refuses oci:// (the
# standard set, with OCI, is cartonstore.config.pulling's).
URLS_ONLY = SourceKinds((CARTON_URL,))


def fast_config(**kw) -> FetchConfig:
    policy = kw.pop("policy", TEST_POLICY)
    return FetchConfig(**{**FAST, **kw}, policy=policy)


def linked_carton(tmp_path: Path, origin, blobs: dict[str, bytes], *, urls: dict[str, list[str]] | None = None,
                  name: str = "linked.carton", extra: dict[str, bytes] | None = None) -> tuple[Path, dict[str, str]]:
    """A carton whose files ``blobs`` (path -> bytes) are served by origin at
    /blobs/<sha256> and listed only in LINKS. Returns (carton path, path -> sha)."""
    files = {"carton.toml": MINIMAL_TOML, **(extra or {}), **blobs}
    shas = {p: sha(d) for p, d in blobs.items()}
    links = {}
    for p, d in blobs.items():
        origin.put(f"/blobs/{shas[p]}", d)
        links[shas[p]] = (urls or {}).get(p, [origin.url(f"/blobs/{shas[p]}")])
    path = write_zip(tmp_path / name, carton_entries(files, links=build_links(links), omit=tuple(blobs)))
    return path, shas


def pull(store: Store, source: str, config: FetchConfig | None = None, *,
         sources: SourceKinds = URLS_ONLY, **kw) -> PullResult:
    async def run() -> PullResult:
        async with Puller(store, config or fast_config(), sources=sources) as p:
            return await p.add(source, **kw)
    return asyncio.run(run())


def materialize(store: Store, ref: str, config: FetchConfig | None = None, *,
                sources: SourceKinds = URLS_ONLY) -> Path:
    async def run() -> Path:
        async with Puller(store, config or fast_config(), sources=sources) as p:
            return await p.materialize(ref)
    return asyncio.run(run())


def blob_files(store: Store) -> list[str]:
    return sorted(store.blobs.iter_digests())


def tmp_files(store: Store) -> list[str]:
    return work_in_tmp(store.root)


def linked_cartons_for_proxy(tmp_path: Path, origin, blobs: dict[str, bytes]) -> str:
    """A carton at origin's /m.carton whose files ``blobs`` are only in LINKS
    (origin's /blobs/<sha256>); returns its URL."""
    path, _ = linked_carton(tmp_path, origin, blobs)
    origin.put_file("/m.carton", path)
    return origin.url("/m.carton")
