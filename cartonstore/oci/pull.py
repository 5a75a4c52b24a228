"""Adding a carton from an OCI registry.

The manifest is fetched and checked (artifact.py); carton.toml, MANIFEST
and the other small files check_carton reads are fetched into memory and
verified; the carton is validated like any other; then every blob the store
lacks is fetched through the fetch path (Range resume, parallel parts for
big blobs, retries, verified by hash and by the manifest's size) into
staging, and the carton and its blobs are committed together, so a bad
blob leaves the store as it was. Each blob's registry URL is recorded as
its source, so blobs a collection evicts come back from the registry.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
from typing import TYPE_CHECKING, BinaryIO

from ..checks import check_carton
from ..errors import InvalidCarton, IntegrityError, ManifestMismatch
from ..fetch.policy import describe
from ..fetch.stats import Tally
from ..format.manifest import build_manifest
from ..sources.view import METADATA_LIMITS, STRING_TENSOR_LIMIT, SourceFile
from ..store.ingest import IngestResult, Staging, check_staged_safetensors
from ..fetch.transfer import fetch_blob
from .artifact import Layer, parse_manifest
from .reference import OciReference
from .registry import Registry

if TYPE_CHECKING:
    from ..fetch.puller import Puller

METADATA_NAMES = ("MANIFEST", "LINKS")


def small_file_limit(path: str) -> int | None:
    """How much of a file check_carton reads whole, or None for a blob it never reads."""
    if path in METADATA_LIMITS:
        return METADATA_LIMITS[path]
    if path.startswith("tensor_data/") and path.endswith(".toml"):
        return STRING_TENSOR_LIMIT
    return None


class OciCartonView:
    """A CartonView of an artifact's layers whose small files were fetched."""

    def __init__(self, label: str, layers: list[Layer], small: dict[str, bytes]) -> None:
        self.label = label
        self._small = small
        self.files = {layer.path: SourceFile(layer.path, "file", layer.size)
                      for layer in layers if layer.path not in METADATA_NAMES}

    def read_metadata(self, name: str) -> bytes | None:
        return self._small.get(name)

    def open(self, path: str) -> BinaryIO:
        return io.BytesIO(self._small[path])

    def close(self) -> None:
        pass


async def read_small_blob(registry: Registry, layer: Layer, limit: int, puller: "Puller") -> bytes:
    """A small layer's bytes, checked against its digest and size."""
    if layer.size > limit:
        raise InvalidCarton(layer.path, f"is {layer.size} bytes, more than the {limit} allowed for this file")
    url = registry.blob_url(layer.digest)
    stats = puller.stats
    stats.request()
    parts, got = [], 0
    async with puller.client.get(url, encoded=False) as r:
        tally = Tally(stats, layer.size, source="registry")
        try:
            async for chunk in r.chunks():
                got += len(chunk)
                tally.add(len(chunk))
                if got > layer.size:
                    raise IntegrityError(f"{describe(url)} ({layer.path}): the registry sends more than the "
                                         f"{layer.size} bytes its manifest says", subject=url)
                parts.append(chunk)
        finally:
            tally.settle()
    data = b"".join(parts)
    if len(data) != layer.size:
        raise IntegrityError(f"{describe(url)} ({layer.path}): the registry sent {len(data)} bytes, its manifest "
                             f"says {layer.size}", subject=url)
    if hashlib.sha256(data).hexdigest() != layer.digest:
        raise ManifestMismatch(layer.path, f"the bytes {describe(url)} sent do not hash to sha256:{layer.digest}")
    stats.blobs("registry")
    return data


def check_layers(layers: list[Layer], listed: dict[str, str]) -> None:
    """Every MANIFEST path has its layer, with the MANIFEST hash as digest,
    and one digest has one size."""
    by_path = {layer.path: layer for layer in layers}
    sizes: dict[str, int] = {}
    for path, digest in listed.items():
        layer = by_path.get(path)
        if layer is None:
            raise InvalidCarton(path, f"is listed in MANIFEST (sha256 {digest}) but the artifact has no layer for it")
        if layer.digest != digest:
            raise ManifestMismatch(path, f"its layer is sha256:{layer.digest}, MANIFEST says {digest}")
    for layer in layers:
        if sizes.setdefault(layer.digest, layer.size) != layer.size:
            raise IntegrityError(f"the manifest gives blob sha256:{layer.digest} two sizes ({sizes[layer.digest]} "
                                 f"and {layer.size})", subject=layer.digest)


async def add_from_registry(puller: "Puller", ref: OciReference, name: str | None, force: bool) -> IngestResult:
    registry = Registry(puller.client, ref)
    raw, media_type, manifest_digest = await registry.get_manifest()
    layers = parse_manifest(raw, str(ref), media_type)
    by_path = {layer.path: layer for layer in layers}
    if "carton.toml" not in by_path:
        raise InvalidCarton("carton.toml", f"{ref}: the artifact has no layer titled carton.toml")
    wanted = {p: limit for p in by_path if (limit := small_file_limit(p)) is not None}
    fetched = await asyncio.gather(*(read_small_blob(registry, by_path[p], limit, puller)
                                     for p, limit in wanted.items()))
    small = dict(zip(wanted, fetched, strict=True))
    if "MANIFEST" not in small:  # pushed file by file by another tool: the titles and digests say it all
        small["MANIFEST"] = build_manifest({layer.path: layer.digest for layer in layers
                                            if layer.path not in METADATA_NAMES})
    view = OciCartonView(str(ref), layers, small)
    checked = await asyncio.to_thread(check_carton, view, links_raw=b"")
    check_layers(layers, checked.manifest.as_dict())
    urls = {layer.digest: (registry.blob_url(layer.digest),) for layer in layers if layer.path not in METADATA_NAMES}
    checked = dataclasses.replace(checked, links=urls)
    staging = Staging(puller.store.blobs)
    try:
        await asyncio.to_thread(_stage_small, staging, checked.digest, small, by_path)
        sizes = {layer.digest: layer.size for layer in layers}
        missing = await asyncio.to_thread(
            lambda: [d for d in urls if d not in staging.staged and not puller.store.blobs.has(d)])
        slots = asyncio.Semaphore(puller.config.max_concurrency)

        async def stage(digest: str) -> None:
            async with slots:
                staged = await fetch_blob(puller.client, puller.store.blobs, digest, urls[digest], puller.config,
                                          stats=puller.stats, kind_of=lambda _u: "registry",
                                          expected_size=sizes[digest])
                staging.add_staged(staged)

        await _all_or_none(stage(d) for d in missing)
        await asyncio.to_thread(check_staged_safetensors, checked, staging)
        pinned = ref.with_digest(manifest_digest)
        return await asyncio.to_thread(puller.store.commit_checked, checked, staging, name=name,
                                       source=str(pinned), force=force)
    except BaseException:
        staging.discard()
        raise


def _stage_small(staging: Staging, carton: str, small: dict[str, bytes], by_path: dict[str, Layer]) -> None:
    if not staging.blobs.has(carton):
        staging.add_bytes(small["MANIFEST"], carton)
    for path, data in small.items():
        layer = by_path.get(path)
        if layer is not None and path not in METADATA_NAMES and not staging.blobs.has(layer.digest) \
                and layer.digest not in staging.staged:
            staging.add_bytes(data, layer.digest)


async def _all_or_none(work) -> None:  # noqa: ANN001 - an iterable of coroutines
    """Run them all; on the first failure cancel the rest, wait for them, and raise it."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
