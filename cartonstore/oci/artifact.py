"""A carton as an OCI image manifest, both ways. Pure.

The layout (docs/fetching.md, "Cartons in OCI registries"):

- ``artifactType`` is ``application/vnd.carton.v1``; the config is OCI's
  empty descriptor (``{}``), as the image spec's artifact guidance says.
- One layer per MANIFEST path, in MANIFEST order except that carton.toml
  comes first and MANIFEST itself second. Each layer's digest is
  ``sha256:`` + the file's MANIFEST hash, so the registry stores every file
  once across every carton pushed to it, and each carries its path as the
  ``org.opencontainers.image.title`` annotation (what oras writes and reads).

Read back, any layer media type is taken (a carton pushed by oras has its
own), but a layer must name its path, the path must be a valid carton path,
and a path may appear once. MANIFEST may be absent (files pushed by another
tool): it is then rebuilt from the titles and digests, which is exactly
what the carton's MANIFEST would say.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cartonstore.errors import InvalidCarton, InvalidInput
from cartonstore.format.paths import carton_path_problem

ARTIFACT_TYPE = "application/vnd.carton.v1"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
IMAGE_CONFIG = ("application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json")
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
EMPTY_DIGEST = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
TITLE = "org.opencontainers.image.title"
ORAS_UNPACK = "io.deis.oras.content.unpack"   # a directory oras tarred into one layer
LAYER_MEDIA_TYPES = {
    "carton.toml": "application/vnd.carton.config.v1+toml",
    "MANIFEST": "application/vnd.carton.manifest.v1",
}
FILE_MEDIA_TYPE = "application/vnd.carton.file.v1"
# Distribution refuses manifests over 4 MiB; nothing bigger is read.
MAX_MANIFEST_SIZE = 4 << 20
# Every media type a carton's manifest may come as, for Accept.
ACCEPT = ", ".join((OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST))


@dataclass(frozen=True)
class Layer:
    path: str
    digest: str     # 64 hex digits, without "sha256:"
    size: int
    media_type: str = FILE_MEDIA_TYPE

    def descriptor(self) -> dict:
        return {"mediaType": self.media_type, "digest": f"sha256:{self.digest}", "size": self.size,
                "annotations": {TITLE: self.path}}


def layers_for(files: list[tuple[str, str, int]]) -> list[Layer]:
    """(path, sha256 hex, size) of each MANIFEST path plus MANIFEST itself
    -> the layers, carton.toml first and MANIFEST second."""
    order = {"carton.toml": 0, "MANIFEST": 1}
    ranked = sorted(files, key=lambda f: order.get(f[0], 2))   # stable: MANIFEST order otherwise
    return [Layer(p, d, s, LAYER_MEDIA_TYPES.get(p, FILE_MEDIA_TYPE)) for p, d, s in ranked]


def build_manifest(layers: list[Layer], annotations: dict[str, str] | None = None) -> bytes:
    """The image manifest of a carton, as the bytes to push."""
    manifest: dict = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": f"sha256:{EMPTY_DIGEST}", "size": len(EMPTY_BLOB)},
        "layers": [layer.descriptor() for layer in layers],
    }
    if annotations:
        manifest["annotations"] = dict(annotations)
    return json.dumps(manifest, separators=(",", ":"), ensure_ascii=False).encode()


def json_object(raw: bytes, what: str, where: str) -> dict[str, Any]:
    """``raw`` as a JSON object; InvalidInput names ``what`` is not one."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidInput(f"{where}: {what} is not JSON ({e})", subject=where) from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"{where}: {what} is not a JSON object", subject=where)
    return doc


def load_manifest(raw: bytes, where: str, media_type: str | None = None) -> dict[str, Any]:
    """An image manifest's JSON, its shape checked (schemaVersion 2, config,
    layers; an index refused); InvalidInput names what is wrong.
    ``media_type`` is the Content-Type the registry served it with."""
    if len(raw) > MAX_MANIFEST_SIZE:
        raise InvalidInput(f"{where}: manifest is {len(raw)} bytes, more than the {MAX_MANIFEST_SIZE} "
                           f"a registry serves", subject=where)
    doc = json_object(raw, "manifest", where)
    kind = doc.get("mediaType") or media_type
    if kind in (OCI_INDEX, DOCKER_LIST) or "manifests" in doc:
        raise InvalidInput(f"{where}: is an image index (a list of manifests), not a carton; name the "
                           f"carton's own manifest by its tag or digest", subject=where)
    if doc.get("schemaVersion") != 2 or not isinstance(doc.get("config"), dict) \
            or not isinstance(doc.get("layers"), list):
        raise InvalidInput(f"{where}: not an OCI image manifest (schemaVersion 2 with config and layers)",
                           subject=where)
    return doc


def artifact_type_of(doc: dict[str, Any]) -> object:
    """What an artifact says it is: ``artifactType``, else the config's media type."""
    return doc.get("artifactType") or doc["config"].get("mediaType")


def parse_manifest(raw: bytes, where: str, media_type: str | None = None) -> list[Layer]:
    """The layers of a carton's manifest; InvalidInput (or InvalidCarton for
    a path) names what is wrong. ``media_type`` is the Content-Type the
    registry served it with."""
    return carton_layers(load_manifest(raw, where, media_type), where)


def carton_layers(doc: dict[str, Any], where: str) -> list[Layer]:
    """The layers of a carton's manifest, loaded (load_manifest)."""
    artifact_type = artifact_type_of(doc)
    if artifact_type != ARTIFACT_TYPE:
        what = "a container image" if artifact_type in IMAGE_CONFIG else f"an artifact of type {artifact_type!r}"
        raise InvalidInput(f"{where}: is {what}, not a carton (a carton's artifactType is {ARTIFACT_TYPE})",
                           subject=where)
    layers: list[Layer] = []
    seen: dict[str, int] = {}
    for number, d in enumerate(doc["layers"]):
        layer = _layer(d, number, where)
        if layer.path in seen:
            raise InvalidCarton(layer.path, f"{where}: layers {seen[layer.path]} and {number} both have this path")
        seen[layer.path] = number
        layers.append(layer)
    return layers


@dataclass(frozen=True)
class Descriptor:
    """A layer's (or config's) descriptor, its fields checked."""

    number: int
    digest: str     # 64 hex digits, without "sha256:"
    size: int
    media_type: str
    annotations: dict[str, Any]


def descriptor_of(d: object, number: int, where: str) -> Descriptor:
    """Layer ``number``'s descriptor; InvalidInput names a bad field."""
    what = f"{where}: layer {number}"
    if not isinstance(d, dict):
        raise InvalidInput(f"{what} is not a descriptor (a JSON object)", subject=where)
    digest, size, media = d.get("digest"), d.get("size"), d.get("mediaType")
    if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71 \
            or any(c not in "0123456789abcdef" for c in digest[7:]):
        raise InvalidInput(f"{what}: digest {digest!r} is not sha256: and 64 lowercase hex digits (carton files "
                           f"are named by their sha256)", subject=where)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidInput(f"{what}: size {size!r} is not a byte count", subject=where)
    if not isinstance(media, str):
        raise InvalidInput(f"{what}: no mediaType", subject=where)
    annotations: dict[str, Any] = d["annotations"] if isinstance(d.get("annotations"), dict) else {}
    return Descriptor(number, digest[7:], size, media, annotations)


def _layer(d: object, number: int, where: str) -> Layer:
    what = f"{where}: layer {number}"
    descriptor = descriptor_of(d, number, where)
    path = descriptor.annotations.get(TITLE)
    if ORAS_UNPACK in descriptor.annotations:
        raise InvalidInput(f"{what} ({path!r}) is a directory packed into one archive; push each file as its "
                           f"own layer", subject=where)
    if not isinstance(path, str) or not path:
        raise InvalidInput(f"{what} has no {TITLE} annotation: a carton's layers name their paths",
                           subject=where)
    problem = carton_path_problem(path)
    if problem is not None:
        raise InvalidCarton(path, f"{where}: layer {number}: {problem}")
    return Layer(path, descriptor.digest, descriptor.size, descriptor.media_type)
