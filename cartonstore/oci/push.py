"""Pushing a stored carton to an OCI registry, as a carton artifact
(artifact.py, the default) or as a CNCF ModelPack artifact (modelpack.py).

Blobs the repository already has are not sent (HEAD first); one another
repository of the same registry has (the store knows it as a blob's
registry source) is mounted from there; the rest are uploaded (upload.py),
several at once. The manifest goes last, so a tag never names an artifact
with a blob missing. The carton is held against eviction meanwhile.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cartonstore.errors import InvalidInput
from cartonstore.fetch.holds import holding
from cartonstore.system.single_flight import all_or_none

from .artifact import EMPTY_BLOB, EMPTY_DIGEST, Layer, build_manifest, layers_for
from .auth import repository_of
from .modelpack import modelpack_artifact, modelpack_layers
from .reference import parse_reference
from .registry import Registry
from .upload import upload_blob, upload_bytes

if TYPE_CHECKING:
    from cartonstore.fetch.puller import Puller

PUSH_FORMATS = ("carton", "modelpack")
"""What ``push --format`` writes: a carton artifact, or a ModelPack one."""


@dataclass(frozen=True)
class PushResult:
    reference: str          # oci://host/repo:tag@sha256:... of what was pushed
    carton: str             # the carton's manifest hash
    blobs: int              # distinct blobs of the artifact (config included)
    uploaded: int
    mounted: int
    present: int            # already in the repository
    bytes_uploaded: int
    bytes_total: int        # of the distinct blobs
    format: str = "carton"  # one of PUSH_FORMATS

    def as_json(self) -> dict:
        return dict(self.__dict__)

    def summary(self) -> str:
        from cartonstore.format.units import format_size

        as_format = "" if self.format == "carton" else f" as {self.format}"
        return (f"pushed {self.reference}{as_format}: {self.uploaded} blob(s) uploaded "
                f"({format_size(self.bytes_uploaded)} of {format_size(self.bytes_total)}), {self.mounted} mounted, "
                f"{self.present} already there")


@dataclass(frozen=True)
class _Artifact:
    layers: list[Layer]
    small: dict[str, bytes]     # blobs made here (the config), by digest
    manifest: bytes


async def push_carton(puller: Puller, ref: str, target: str, fmt: str = "carton") -> PushResult:
    if fmt not in PUSH_FORMATS:
        raise InvalidInput(f"push format {fmt!r} is not one of {', '.join(PUSH_FORMATS)}", subject=fmt)
    dest = parse_reference(target)
    if dest.digest:
        raise InvalidInput(f"{target}: push names a tag (oci://HOST/REPO:TAG), not a digest", subject=target)
    store = puller.store
    digest = await asyncio.to_thread(store.resolve, ref)
    async with holding(store, digest, "pushing"):
        await puller.complete(digest)   # a lazily added carton's blobs first
        artifact = await asyncio.to_thread(_artifact_of, puller, digest, fmt)
        layers = artifact.layers
        registry = Registry(puller.client, dest)
        await registry.connect()
        sizes = {layer.digest: layer.size for layer in layers}
        blobs = {**{d: len(b) for d, b in artifact.small.items()}, **sizes}
        counts = {"uploaded": 0, "mounted": 0, "present": 0, "bytes": 0}
        slots = asyncio.Semaphore(puller.config.max_concurrency)

        async def send(blob: str, size: int) -> None:
            async with slots:
                outcome, sent = await _send_blob(puller, registry, blob, size, artifact.small.get(blob))
                counts[outcome] += 1
                counts["bytes"] += sent

        # A blob that fails stops the others: the manifest is not put either way.
        await all_or_none(send(d, s) for d, s in blobs.items())
        manifest_digest = await registry.put_manifest(dest.tag or "latest", artifact.manifest)
        # The registry is now a source of every blob: evicted, they come back from
        # there, and a push to another repository of it mounts them.
        await asyncio.to_thread(store.index.add_links, {layer.digest: [registry.blob_url(layer.digest)]
                                                        for layer in layers})
    return PushResult(str(dest.with_digest(manifest_digest)), digest, len(blobs), counts["uploaded"],
                      counts["mounted"], counts["present"], counts["bytes"], sum(blobs.values()), fmt)


def _artifact_of(puller: Puller, digest: str, fmt: str) -> _Artifact:
    files = _files_of(puller, digest)
    if fmt == "carton":
        layers = layers_for(files)
        return _Artifact(layers, {EMPTY_DIGEST: EMPTY_BLOB}, build_manifest(layers))
    config = puller.store.config_of(digest)
    layers = modelpack_layers(files, config)
    modelpack = modelpack_artifact(layers, config)
    return _Artifact(layers, {modelpack.config_digest: modelpack.config}, modelpack.manifest)


def _files_of(puller: Puller, digest: str) -> list[tuple[str, str, int]]:
    """(path, sha256, size) of each MANIFEST path, and of MANIFEST itself."""
    blobs = puller.store.blobs
    files = [(e.path, e.digest, os.stat(blobs.path(e.digest)).st_size) for e in puller.store.index.entries(digest)]
    return [*files, ("MANIFEST", digest, os.stat(blobs.path(digest)).st_size)]


async def _send_blob(puller: Puller, registry: Registry, digest: str, size: int,
                     data: bytes | None) -> tuple[str, int]:
    """Make the repository hold the blob (``data`` when it was made here,
    else the store's): ("present" | "mounted" | "uploaded", bytes sent)."""
    if await registry.blob_size(digest) == size:
        return "present", 0
    mount_from = await asyncio.to_thread(_other_repository, puller, registry, digest)
    location = await registry.start_upload((digest, mount_from) if mount_from else None)
    if location is None:
        return "mounted", 0
    if data is not None:
        return "uploaded", await upload_bytes(registry, data, digest, location)
    return "uploaded", await upload_blob(registry, str(puller.store.blobs.path(digest)), digest, size, location)


def _other_repository(puller: Puller, registry: Registry, digest: str) -> str | None:
    """A repository of the same registry the store fetched this blob from."""
    prefix = f"{registry.base}/v2/"
    for url in puller.store.index.links_for(digest):
        repo = repository_of(url) if url.startswith(prefix) else None
        if repo and repo != registry.ref.repository:
            return repo
    return None

