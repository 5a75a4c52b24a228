"""Adding a model another tool pushed (model_formats.py) as a carton of its files.

Each raw layer is a file whose blob key is the layer's digest, so weights
pulled as ModelPack, as Docker model-spec and as a carton are one blob; it
is fetched as any carton blob is (peers, mirrors, the registry; verified,
resumable) and its registry URL recorded as its source, so a collection
may evict it and a lazy add may leave it for later. A tar layer is
unpacked as it streams from the registry (unpack.py): its files have no
source to come back from, so it is unpacked at add time, and a lazy add
of an artifact that has one is refused. The carton.toml is generated
(cartonstore.carton.from_files): the model's name from the repository, its
format from the config's ``config.format`` where the format has one
(ModelPack, Docker), else from the files.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from cartonstore.carton.checks import check_carton
from cartonstore.carton.from_files import ListedFile, files_carton
from cartonstore.errors import IntegrityError, InvalidCarton, InvalidInput
from cartonstore.fetch.transfer.download import download
from cartonstore.store.content.blobs import StagedBlob
from cartonstore.store.ingest import IngestResult, Staging

from .layer_blobs import LayerBlobs
from .model_formats import MAX_CONFIG_SIZE, ModelArtifact, ModelLayer, weights_format
from .reference import OciReference
from .registry import Registry
from .unpack import unpack_layer

if TYPE_CHECKING:
    from cartonstore.fetch.puller import Puller


def lazy_refusal(artifact: ModelArtifact, where: str) -> InvalidInput | None:
    """Why a lazy add of this artifact cannot be: a tar layer is unpacked only
    when added (its files have no source to be fetched from later)."""
    if not artifact.tars:
        return None
    layer = artifact.tars[0]
    return InvalidInput(f"{where}: cannot be added lazily: {layer} ({layer.media_type}) is a tar archive, "
                        f"unpacked only while it is added; add it without --lazy", subject=where)


async def add_model_artifact(puller: Puller, registry: Registry, ref: OciReference, manifest_digest: str,
                             artifact: ModelArtifact, name: str | None, force: bool, lazy: bool) -> IngestResult:
    where = str(ref)
    if lazy and (refusal := lazy_refusal(artifact, where)) is not None:
        raise refusal
    sizes = {layer.digest: layer.size for layer in artifact.raw}
    async with puller.fetcher.peers.claiming(sizes) as claims:  # until committed (peers.py)
        blobs = LayerBlobs(puller, registry, sizes, Staging(puller.store.blobs), claims)
        try:
            return await _add(puller, registry, ref, manifest_digest, artifact, blobs, name, force, lazy)
        except BaseException:
            blobs.staging.discard()
            raise


async def _add(puller: Puller, registry: Registry, ref: OciReference, manifest_digest: str,
               artifact: ModelArtifact, blobs: LayerBlobs, name: str | None, force: bool,
               lazy: bool) -> IngestResult:
    where = str(ref)
    fmt = description = None
    if artifact.config is not None:
        fmt, description = weights_format(await _read_config(puller, registry, artifact, where), where)
    files = {layer.path: ListedFile(layer.digest, layer.size) for layer in artifact.raw if layer.path is not None}
    for layer in artifact.tars:
        _take_unpacked(files, await _unpack(puller, registry, layer), blobs.staging, layer, where)
    carton_name = ref.repository.rsplit("/", 1)[-1]
    carton = files_carton(carton_name, files, origin=where, fmt=fmt, description=description)
    await asyncio.to_thread(check_carton, carton.view(where), links_raw=b"")   # before any layer is fetched
    urls: dict[str, tuple[str, ...]] = {layer.digest: (registry.source_url(layer.digest),) for layer in artifact.raw}
    await blobs.stage_missing(urls, lazy=lazy)
    return await asyncio.to_thread(
        puller.store.commit_files_carton, carton, blobs.staging, model_name=carton_name, origin=where, links=urls,
        kind="oci", name=name, source=str(ref.with_digest(manifest_digest)), force=force, read_files=not lazy,
        description=description)


async def _unpack(puller: Puller, registry: Registry, layer: ModelLayer) -> list[tuple[str, StagedBlob]]:
    await registry.connect()
    return await unpack_layer(puller.client, registry.blob_url(layer.digest), layer, puller.store.blobs,
                              puller.config, puller.store.zip_limits, stats=puller.stats)


def _take_unpacked(files: dict[str, ListedFile], unpacked: list[tuple[str, StagedBlob]], staging: Staging,
                   layer: ModelLayer, where: str) -> None:
    """The files of a tar layer added to the model's, their blobs to the
    staging (one copy of each); a path already taken is refused."""
    try:
        for path, staged in unpacked:
            if path in files:
                raise InvalidCarton(path, f"{where}: {layer} holds a file at a path another layer already has")
            files[path] = ListedFile(staged.digest, staged.size)
    except BaseException:
        for _path, staged in unpacked:
            staged.discard()
        raise
    for _path, staged in unpacked:
        if staged.digest in staging.staged:
            staged.discard()
        else:
            staging.add_staged(staged)


async def _read_config(puller: Puller, registry: Registry, artifact: ModelArtifact, where: str) -> bytes:
    """The model config's bytes, verified; never kept in the store (the
    carton's own carton.toml says what it says)."""
    config = artifact.config
    assert config is not None
    if config.size > MAX_CONFIG_SIZE:
        raise InvalidInput(f"{where}: the model config is {config.size} bytes, more than the {MAX_CONFIG_SIZE} "
                           f"read", subject=where)
    await registry.connect()
    url = registry.blob_url(config.digest)
    with puller.store.blobs.writer(label="config") as writer:
        await download(puller.client, url, writer, puller.config, stats=puller.stats, source="registry",
                       expected_size=config.size)
        if writer.digest != config.digest:
            raise IntegrityError(f"{where}: the model config's bytes hash to sha256:{writer.digest}, its "
                                 f"descriptor says sha256:{config.digest}", subject=where)
        return await asyncio.to_thread(writer.tmp_path.read_bytes)
