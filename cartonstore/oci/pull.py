"""Adding a carton, or a model another tool pushed, from an OCI registry.

The manifest is fetched and checked (artifact.py); a carton artifact is
read here, and so a ModelPack artifact that holds a carton (carton.toml and
MANIFEST at its top, model_formats.pushed_carton_layers); any other model
format by model_pull.py. The small files check_carton reads whole
(carton.toml, MANIFEST, tensor_data/*.toml) are taken from the store when
it has them, else fetched; the carton is validated like any other; then
every blob the store lacks is fetched. Every download goes through the
fetch path (Range resume, parallel parts for big blobs, retries), is
verified by hash and by the manifest's size as it is written, and is
staged, so the carton and its blobs are committed together and a bad blob
leaves the store as it was. Each blob's registry URL is
recorded as its source, so blobs a collection evicts come back from the
registry.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

from cartonstore.carton.checks import check_carton
from cartonstore.carton.from_files import ListedCartonView, ListedFile
from cartonstore.errors import IntegrityError, InvalidCarton, ManifestMismatch
from cartonstore.fetch.sources.remote_zip import read_whole_limit
from cartonstore.format.manifest import build_manifest
from cartonstore.sources.zip_source import METADATA_NAMES
from cartonstore.store.ingest import IngestResult, Provenance, Staging, check_staged_safetensors
from cartonstore.system.single_flight import all_or_none

from .artifact import Layer, carton_layers, load_manifest
from .layer_blobs import LayerBlobs
from .model_formats import model_artifact, pushed_carton_layers, served_manifest_type
from .model_pull import add_model_artifact
from .reference import OciReference
from .registry import Registry

if TYPE_CHECKING:
    from cartonstore.fetch.puller import Puller


async def _read_small(blobs: LayerBlobs, by_path: dict[str, Layer]) -> dict[str, bytes]:
    """The files check_carton reads whole, each within its size limit."""
    wanted = [p for p in by_path if read_whole_limit(p) is not None]
    for path in wanted:
        limit = read_whole_limit(path)
        if by_path[path].size > limit:  # type: ignore[operator]  # wanted: a limit is set
            raise InvalidCarton(path, f"is {by_path[path].size} bytes, more than the {limit} allowed for this file")
    digests = list(dict.fromkeys(by_path[p].digest for p in wanted))
    data = dict(zip(digests, await all_or_none(blobs.read(d) for d in digests), strict=True))
    return {p: data[by_path[p].digest] for p in wanted}


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


async def add_from_registry(puller: Puller, ref: OciReference, name: str | None, force: bool,
                            lazy: bool = False) -> IngestResult:
    """The artifact ``ref`` names, added: a carton as it is (a carton artifact,
    or a ModelPack artifact that holds one), any other model format as a
    carton of its files (model_pull.py). ``lazy``: the blobs that are layers
    are fetched later (LINKS: their registry URLs)."""
    registry = Registry(puller.client, ref, puller.fetcher.mirrors_passed_over)
    raw, media_type, manifest_digest = await registry.get_manifest()
    doc = load_manifest(raw, str(ref), served_manifest_type(media_type))
    artifact = model_artifact(doc, str(ref), served=media_type)
    if artifact is None:
        layers = carton_layers(doc, str(ref))
    else:
        pushed_carton = pushed_carton_layers(artifact, str(ref))
        if pushed_carton is None:
            return await add_model_artifact(puller, registry, ref, manifest_digest, artifact, name, force, lazy)
        layers = pushed_carton
    by_path = {layer.path: layer for layer in layers}
    if "carton.toml" not in by_path:
        raise InvalidCarton("carton.toml", f"{ref}: the artifact has no layer titled carton.toml")
    sizes = {layer.digest: layer.size for layer in layers}   # one size per digest: checked below
    async with puller.fetcher.peers.claiming(sizes) as claims:  # until committed (peers.py)
        return await _add_layers(puller, registry, ref, manifest_digest, layers, LayerBlobs(
            puller, registry, sizes, Staging(puller.store.blobs), claims), name, force, lazy)


async def _add_layers(puller: Puller, registry: Registry, ref: OciReference, manifest_digest: str,
                      layers: list[Layer], blobs: LayerBlobs, name: str | None, force: bool,
                      lazy: bool) -> IngestResult:
    by_path = {layer.path: layer for layer in layers}
    staging = blobs.staging
    try:
        small = await _read_small(blobs, by_path)
        if "MANIFEST" not in small:  # pushed file by file by another tool: the titles and digests say it all
            small["MANIFEST"] = build_manifest({layer.path: layer.digest for layer in layers
                                                if layer.path not in METADATA_NAMES})
        view = ListedCartonView(str(ref), {layer.path: ListedFile(layer.digest, layer.size) for layer in layers}, small,
                                frozenset(METADATA_NAMES))
        checked = await asyncio.to_thread(check_carton, view, links_raw=b"")
        check_layers(layers, checked.manifest.as_dict())
        urls: dict[str, tuple[str, ...]] = {layer.digest: (registry.source_url(layer.digest),) for layer in layers
                if layer.path not in METADATA_NAMES}
        checked = dataclasses.replace(checked, links=urls)
        if "MANIFEST" not in by_path and not puller.store.blobs.has(checked.digest):
            await asyncio.to_thread(staging.add_bytes, small["MANIFEST"], checked.digest)
        await blobs.stage_missing(urls, lazy=lazy)
        await asyncio.to_thread(check_staged_safetensors, checked, staging)
        made_here = frozenset() if "MANIFEST" in by_path else frozenset({checked.digest})
        return await asyncio.to_thread(puller.store.commit_checked, checked, staging, name=name,
                                       source=str(ref.with_digest(manifest_digest)), force=force,
                                       provenance=Provenance("oci", made_here))
    except BaseException:
        staging.discard()
        raise
