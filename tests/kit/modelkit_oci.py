"""OCI model artifacts as other tools push them, built with the media types
and annotations of each spec (cartonstore/oci/model_formats.py cites the
versions): ModelPack (cncf and cnai), Docker model-spec, KitOps, ORAS
generic, Ollama. Each builder returns an Artifact (its manifest and every
blob) that ``push`` sends to a real registry and ``serve`` to a fake one
(tests/kit/origin.py)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
EMPTY_CONFIG = {"mediaType": "application/vnd.oci.empty.v1+json",
                "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", "size": 2}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Artifact:
    manifest: bytes
    media_type: str
    blobs: list[bytes] = field(default_factory=list)

    @property
    def doc(self) -> dict:
        return json.loads(self.manifest)


def descriptor(media_type: str, data: bytes, annotations: dict[str, str] | None = None) -> dict:
    d: dict = {"mediaType": media_type, "digest": f"sha256:{sha(data)}", "size": len(data)}
    if annotations:
        d["annotations"] = annotations
    return d


def _artifact(layers: list[tuple[dict, bytes]], config: tuple[dict, bytes] | None = None, *,
              artifact_type: str | None = None, media_type: str = OCI_MANIFEST) -> Artifact:
    config_d, config_bytes = config if config is not None else (EMPTY_CONFIG, b"{}")
    doc: dict = {"schemaVersion": 2, "mediaType": media_type}
    if artifact_type:
        doc["artifactType"] = artifact_type
    doc |= {"config": config_d, "layers": [d for d, _ in layers]}
    return Artifact(json.dumps(doc).encode(), media_type, [config_bytes, *(data for _, data in layers)])


# -- tar layers -------------------------------------------------------------------------


def tar_of(members: list[tuple[str, bytes]] | list[tarfile.TarInfo | tuple[str, bytes]],
           compression: str = "") -> bytes:
    """A tar of (name, bytes) files (a TarInfo as given: links, devices...),
    gzip- or zstd-compressed when asked."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isreg() else None)
                continue
            name, data = member
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return compressed(out.getvalue(), compression)


def compressed(raw: bytes, compression: str) -> bytes:
    if compression == "gzip":
        return gzip.compress(raw, mtime=0)
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdCompressor().compress(raw)
    return raw


def header_claiming(kind: bytes, size: int, compression: str = "gzip") -> bytes:
    """A tar whose first header is of type ``kind`` (a pax or GNU long-name
    header) declaring ``size`` bytes, followed by a few KiB of zeros."""
    info = tarfile.TarInfo("././@Header")
    info.type = kind
    info.size = size
    return compressed(info.tobuf(format=tarfile.GNU_FORMAT) + bytes(4096), compression)


def headers_ahead(kind: bytes, count: int, file: tuple[str, bytes]) -> bytes:
    """A gzip tar of one file with ``count`` empty headers of type ``kind`` ahead of it."""
    empty = tarfile.TarInfo("././@Header")
    empty.type = kind
    return compressed(empty.tobuf(format=tarfile.GNU_FORMAT) * count + tar_of([file]), "gzip")


def special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    """A tar member of type ``kind`` (tarfile.SYMTYPE, LNKTYPE, CHRTYPE...)."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


# -- the formats ------------------------------------------------------------------------


def modelpack(raw: dict[str, bytes], tars: list[tuple[str, bytes]] | None = None, *, prefix: str = "cncf",
              fmt: str | None = "safetensors", description: str | None = None) -> Artifact:
    """ModelPack v1: raw weight layers with filepath annotations, then tar
    layers given as (media type suffix ``tar``/``tar+gzip``/``tar+zstd``, bytes)."""
    layers = [(descriptor(f"application/vnd.{prefix}.model.weight.v1.raw", data,
                          {f"org.{prefix}.model.filepath": path}), data) for path, data in raw.items()]
    layers += [(descriptor(f"application/vnd.{prefix}.model.weight.config.v1.{kind}", data,
                           {f"org.{prefix}.model.filepath": "config"}), data) for kind, data in tars or []]
    config: dict = {"descriptor": {"name": "m", **({"description": description} if description else {})},
                    "modelfs": {"type": "layers", "diffIds": [f"sha256:{sha(d)}" for _, d in layers]},
                    "config": {"format": fmt} if fmt else {}}
    config_bytes = json.dumps(config).encode()
    return _artifact(layers, (descriptor(f"application/vnd.{prefix}.model.config.v1+json", config_bytes),
                              config_bytes), artifact_type=f"application/vnd.{prefix}.model.manifest.v1+json")


def docker_model(layers: list[tuple[str, bytes, str | None]], *, version: str = "v0.1",
                 fmt: str = "gguf") -> Artifact:
    """Docker model-spec: (media type suffix after vnd.docker.ai., bytes,
    filepath annotation or None) per layer."""
    built = [(descriptor(f"application/vnd.docker.ai.{kind}", data,
                         {"org.cncf.model.filepath": path} if path else None), data) for kind, data, path in layers]
    config = json.dumps({"config": {"format": fmt, "size": "1"},
                         "rootfs": {"type": "rootfs", "diff_ids": [d["digest"] for d, _ in built]}}).encode()
    return _artifact(built, (descriptor(f"application/vnd.docker.ai.model.config.{version}+json", config), config))


def kitops(layers: list[tuple[str, bytes]]) -> Artifact:
    """A KitOps ModelKit: (media type after vnd.kitops.modelkit., tar bytes)
    per layer, the Kitfile as config."""
    kitfile = json.dumps({"manifestVersion": "1.0.0", "package": {"name": "m"},
                          "model": {"name": "m", "path": "model"}}).encode()
    built = [(descriptor(f"application/vnd.kitops.modelkit.{kind}", data), data) for kind, data in layers]
    return _artifact(built, (descriptor("application/vnd.kitops.modelkit.config.v1+json", kitfile), kitfile))


def oras(files: dict[str, bytes], directories: dict[str, bytes] | None = None) -> Artifact:
    """What ``oras push`` writes: one layer per file titled by its name, a
    directory as a tar+gzip layer annotated to be unpacked."""
    layers = [(descriptor("application/vnd.oci.image.layer.v1.tar", data,
                          {"org.opencontainers.image.title": path}), data) for path, data in files.items()]
    layers += [(descriptor("application/vnd.oci.image.layer.v1.tar+gzip", data,
                           {"org.opencontainers.image.title": name, "io.deis.oras.content.unpack": "true",
                            "io.deis.oras.content.digest": "sha256:" + sha(gzip.decompress(data))}), data)
               for name, data in (directories or {}).items()]
    return _artifact(layers, artifact_type="application/vnd.unknown.artifact.v1")


def ollama(layers: list[tuple[str, bytes]]) -> Artifact:
    """An Ollama manifest: Docker schema2, a container image config, layers
    ``application/vnd.ollama.image.<kind>``."""
    config = json.dumps({"model_format": "gguf", "model_family": "llama", "file_type": "Q4_0",
                         "architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    built = [(descriptor(f"application/vnd.ollama.image.{kind}", data), data) for kind, data in layers]
    return _artifact(built, (descriptor("application/vnd.docker.container.image.v1+json", config), config),
                     media_type=DOCKER_MANIFEST)


# -- sending them -----------------------------------------------------------------------


def push(registry, repo: str, tag: str, artifact: Artifact) -> str:
    """Push to a real registry (tests/kit/registrykit.py); returns the reference."""
    for data in artifact.blobs:
        registry.put_blob(repo, data)
    registry.put_manifest(repo, tag, artifact.manifest, artifact.media_type)
    return registry.ref(f"{repo}:{tag}")


def serve(origin, artifact: Artifact, *, faults: dict | None = None, content_type: str | None = None) -> str:
    """Serve from a fake registry (tests/kit/origin.py), repository "r" tag
    "t"; ``faults``: blob sha256 -> Fault. Returns the reference."""
    origin.put("/v2/", b"{}")
    for data in artifact.blobs:
        origin.put(f"/v2/r/blobs/sha256:{sha(data)}", data, fault=(faults or {}).get(sha(data)))
    origin.put("/v2/r/manifests/t", artifact.manifest, content_type=content_type or artifact.media_type)
    return f"oci://127.0.0.1:{origin.port}/r:t"
