"""The OCI model formats other tools push, read as model files. Pure.

A manifest (load_manifest, artifact.py) is recognised by its
``artifactType`` or config media type, and each layer becomes either one
file (a *raw* layer: the layer's bytes are the file, so its digest is the
file's blob key) or a tar archive unpacked at add time (unpack.py):

- **ModelPack**, CNCF model-spec v1 (``modelpack/model-spec``,
  ``specs-go/v1``: mediatype.go, annotations.go, config.go): artifactType
  ``application/vnd.cncf.model.manifest.v1+json``, config
  ``application/vnd.cncf.model.config.v1+json``; layers
  ``application/vnd.cncf.model.{weight,weight.config,doc,code,dataset}.v1.{raw,tar,tar+gzip,tar+zstd}``;
  a raw layer's path is its ``org.cncf.model.filepath`` annotation; the
  config's ``config.format`` names the weights' format. The older
  ``vnd.cnai.model.*`` / ``org.cnai.model.filepath`` names modctl still
  writes are read alike.
- **Docker model-spec** (``docker/model-runner``,
  ``pkg/distribution/types/config.go``): config
  ``application/vnd.docker.ai.model.config.v0.1+json`` (flat files) or
  ``v0.2+json`` (paths in ``org.cncf.model.filepath``); layers
  ``application/vnd.docker.ai.{gguf.v3,safetensors,dduf,license,mmproj,chat.template.jinja}``
  raw, ``...dir.tar`` and ``...vllm.config.tar`` tar. A raw layer without a
  path annotation is named from its media type (NAMES_BY_MEDIA_TYPE);
  shards of one type are numbered in layer order as llama.cpp and
  Hugging Face name them (``model-00001-of-00002.gguf``). ``config.format``
  names the weights' format.
- **KitOps ModelKit** (``kitops-ml/kitops``, pkg/lib/constants: media
  types): config ``application/vnd.kitops.modelkit.config.v1+json`` (the
  Kitfile); layers ``application/vnd.kitops.modelkit.{model,modelpart,dataset,code,docs,prompts}.v1.tar[+gzip|+zstd]``,
  each a tar of paths relative to the Kitfile's directory.
- **ORAS** generic artifacts (``oras-go`` v2 file store): any artifact type
  whose layers carry ``org.opencontainers.image.title``; a layer annotated
  ``io.deis.oras.content.unpack`` is a directory oras tarred (gzip unless
  the media type says otherwise), its members named under the title.
- **Ollama** (its registry's manifests, ``ollama/ollama`` server/images.go):
  a Docker schema2 manifest whose layers are
  ``application/vnd.ollama.image.*``; each becomes a file under the name
  format/ollama.py gives it (``model.gguf``, ``template``, ``params.json``...),
  as an adopt of an Ollama directory names it.

A carton (``application/vnd.carton.v1``) is not read here: pull.py takes
it as a carton, and so a carton pushed as a ModelPack artifact (``push
--format modelpack`` keeps a runnable carton's own paths, carton.toml and
MANIFEST at the top: pushed_carton_layers). Every path is checked as a
carton path (no ``..``, not absolute) before anything is fetched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cartonstore.errors import InvalidCarton, InvalidInput
from cartonstore.format.ollama import OLLAMA_PREFIX, numbered_name, ollama_file_names
from cartonstore.format.paths import carton_path_problem

from .artifact import (
    ARTIFACT_TYPE,
    IMAGE_CONFIG,
    ORAS_UNPACK,
    TITLE,
    Descriptor,
    Layer,
    artifact_type_of,
    descriptor_of,
    json_object,
)

MODELPACK, DOCKER_MODEL, KITOPS, ORAS, OLLAMA = "modelpack", "docker-model", "kitops", "oras", "ollama"

MODELPACK_PREFIXES = ("cncf", "cnai")
MODELPACK_ARTIFACT_TYPES = tuple(f"application/vnd.{p}.model.manifest.v1+json" for p in MODELPACK_PREFIXES)
MODELPACK_CONFIGS = tuple(f"application/vnd.{p}.model.config.v1+json" for p in MODELPACK_PREFIXES)
MODELPACK_FILEPATHS = tuple(f"org.{p}.model.filepath" for p in MODELPACK_PREFIXES)
_MODELPACK_LAYER = re.compile(r"application/vnd\.(cncf|cnai)\.model\.([a-z]+(?:\.[a-z]+)?)\.v1\."
                              r"(raw|tar|tar\+gzip|tar\+zstd)")

DOCKER_CONFIGS = ("application/vnd.docker.ai.model.config.v0.1+json",
                  "application/vnd.docker.ai.model.config.v0.2+json")
DOCKER_TARS = ("application/vnd.docker.ai.dir.tar", "application/vnd.docker.ai.vllm.config.tar")
NAMES_BY_MEDIA_TYPE = {
    "application/vnd.docker.ai.gguf.v3": "model.gguf",
    "application/vnd.docker.ai.safetensors": "model.safetensors",
    "application/vnd.docker.ai.dduf": "model.dduf",
    "application/vnd.docker.ai.license": "LICENSE",
    "application/vnd.docker.ai.mmproj": "mmproj.gguf",
    "application/vnd.docker.ai.chat.template.jinja": "chat_template.jinja",
}
"""The file a Docker model-spec raw layer without a path annotation becomes."""
_SHARDED = ("model.gguf", "model.safetensors")

KITOPS_CONFIG = "application/vnd.kitops.modelkit.config.v1+json"
_KITOPS_LAYER = re.compile(r"application/vnd\.kitops\.modelkit\.(model|modelpart|dataset|code|docs|prompts)"
                           r"\.v1\.tar(\+gzip|\+zstd)?")

GZIP, ZSTD, PLAIN, SNIFF = "gzip", "zstd", "", "sniff"
"""A tar layer's compression; SNIFF: told by its first bytes (an ORAS
directory whose media type does not say)."""


@dataclass(frozen=True)
class ModelLayer:
    """One layer of a model artifact: a file (``path``), or a tar archive
    (``compression`` set) whose members are the files."""

    number: int
    digest: str     # 64 hex digits
    size: int
    media_type: str
    path: str | None = None
    compression: str | None = None

    @property
    def is_tar(self) -> bool:
        return self.compression is not None

    def __str__(self) -> str:
        return f"layer sha256:{self.digest}"


@dataclass(frozen=True)
class ModelArtifact:
    """A model artifact's format, layers in order, and the config to read
    for its weights' format (ModelPack, Docker), if any."""

    format: str
    layers: tuple[ModelLayer, ...]
    config: Descriptor | None = None

    @property
    def raw(self) -> tuple[ModelLayer, ...]:
        return tuple(layer for layer in self.layers if not layer.is_tar)

    @property
    def tars(self) -> tuple[ModelLayer, ...]:
        return tuple(layer for layer in self.layers if layer.is_tar)


SERVED_AS_TEXT = "text/plain"
"""How Ollama's registry serves its manifests; no other registry does."""


def served_manifest_type(media_type: str | None) -> str | None:
    """The manifest media type a registry's Content-Type says, None when it
    says nothing of it (Ollama's text/plain: the body says)."""
    return None if media_type == SERVED_AS_TEXT else media_type


def model_artifact(doc: dict[str, Any], where: str, *, served: str | None = None) -> ModelArtifact | None:
    """The model artifact a loaded manifest is, None for a carton (read as
    one); InvalidInput names what is not read, InvalidCarton a path that may
    not be written. ``served``: the Content-Type the registry gave it."""
    artifact = None if artifact_type_of(doc) == ARTIFACT_TYPE else _model_artifact(doc, where)
    if served == SERVED_AS_TEXT and (artifact is None or artifact.format != OLLAMA):
        raise InvalidInput(f"{where}: the registry served the manifest as {SERVED_AS_TEXT}, which only Ollama's "
                           f"registry does, and it is not an Ollama manifest (layers {OLLAMA_PREFIX}*)",
                           subject=where)
    return artifact


def pushed_carton_layers(artifact: ModelArtifact, where: str) -> list[Layer] | None:
    """The layers of a carton pushed as a ModelPack artifact, at the paths
    their filepath annotations name; None for a model artifact read as files.
    A carton.toml at the artifact's top is a carton's (a repository's own
    files are pushed without one, modelpack.py), so the artifact is read as
    the carton: its MANIFEST is required, every file a raw layer."""
    if artifact.format != MODELPACK or not any(layer.path == "carton.toml" for layer in artifact.raw):
        return None
    if artifact.tars:
        raise InvalidCarton("carton.toml", f"{where}: the ModelPack artifact has carton.toml at its top, so it is a "
                                           f"carton, and {artifact.tars[0]} ({artifact.tars[0].media_type}) is a tar "
                                           f"archive: a carton's files are raw layers, one per file")
    if not any(layer.path == "MANIFEST" for layer in artifact.raw):
        raise InvalidCarton("MANIFEST", f"missing: every carton must have one ({where}: the ModelPack artifact has "
                                        f"carton.toml at its top, so it is a carton, and no layer at MANIFEST)")
    return [Layer(layer.path, layer.digest, layer.size, layer.media_type) for layer in artifact.raw
            if layer.path is not None]


def _model_artifact(doc: dict[str, Any], where: str) -> ModelArtifact:
    descriptors = [descriptor_of(d, n, where) for n, d in enumerate(doc["layers"])]
    kind = artifact_type_of(doc)
    config_type = doc["config"].get("mediaType")
    if kind in MODELPACK_ARTIFACT_TYPES or config_type in MODELPACK_CONFIGS:
        layers = [_modelpack_layer(d, where) for d in descriptors]
        return _checked(MODELPACK, layers, where, _config(doc, where))
    if config_type in DOCKER_CONFIGS:
        return _checked(DOCKER_MODEL, _docker_layers(descriptors, where), where, _config(doc, where))
    if isinstance(config_type, str) and config_type.startswith("application/vnd.docker.ai.model.config."):
        raise InvalidInput(f"{where}: Docker model-spec config {config_type!r} is not one read here (v0.1, v0.2)",
                           subject=where)
    if config_type == KITOPS_CONFIG:
        return _checked(KITOPS, [_kitops_layer(d, where) for d in descriptors], where)
    if descriptors and all(d.media_type.startswith(OLLAMA_PREFIX) for d in descriptors):
        return _checked(OLLAMA, _ollama_layers(descriptors, where), where)
    if kind in IMAGE_CONFIG:
        raise InvalidInput(f"{where}: is a container image, not a model (read here: a carton, ModelPack, Docker "
                           f"model-spec, KitOps, ORAS files, Ollama)", subject=where)
    if descriptors and all(isinstance(d.annotations.get(TITLE), str) for d in descriptors):
        return _checked(ORAS, [_oras_layer(d, where) for d in descriptors], where)
    raise InvalidInput(f"{where}: is an artifact of type {kind!r} whose layers do not all name a file "
                       f"({TITLE}): not a carton, ModelPack, Docker model-spec, KitOps, ORAS or Ollama artifact",
                       subject=where)


def _config(doc: dict[str, Any], where: str) -> Descriptor:
    config = descriptor_of(doc["config"], 0, where)
    return Descriptor(-1, config.digest, config.size, config.media_type, config.annotations)


def _named(d: Descriptor, path: object, key: str, where: str) -> ModelLayer:
    """A raw layer at ``path`` (its ``key`` annotation), checked."""
    if not isinstance(path, str) or not path:
        raise InvalidInput(f"{where}: layer {d.number} ({d.media_type}) names no file: no {key} annotation",
                           subject=where)
    problem = carton_path_problem(path)
    if problem is not None:
        raise InvalidCarton(repr(path)[1:-1], f"{where}: layer {d.number}: its {key} annotation {problem}")
    return ModelLayer(d.number, d.digest, d.size, d.media_type, path=path)


def _tar(d: Descriptor, compression: str) -> ModelLayer:
    return ModelLayer(d.number, d.digest, d.size, d.media_type, compression=compression)


def _compression(suffix: str) -> str:
    return {"+gzip": GZIP, "+zstd": ZSTD}.get(suffix, PLAIN)


def _modelpack_layer(d: Descriptor, where: str) -> ModelLayer:
    match = _MODELPACK_LAYER.fullmatch(d.media_type)
    if match is None:
        raise InvalidInput(f"{where}: layer {d.number}: media type {d.media_type!r} is not a ModelPack v1 layer "
                           f"(application/vnd.cncf.model.<kind>.v1.raw|tar|tar+gzip|tar+zstd)", subject=where)
    if match.group(3) != "raw":
        return _tar(d, _compression(match.group(3)[3:]))
    key = next((k for k in MODELPACK_FILEPATHS if k in d.annotations), MODELPACK_FILEPATHS[0])
    return _named(d, d.annotations.get(key), key, where)


def _docker_layers(descriptors: list[Descriptor], where: str) -> list[ModelLayer]:
    layers: list[ModelLayer] = []
    unnamed: dict[str, list[Descriptor]] = {}
    for d in descriptors:
        if d.media_type in DOCKER_TARS:
            layers.append(_tar(d, PLAIN))
            continue
        if d.media_type not in NAMES_BY_MEDIA_TYPE:
            raise InvalidInput(f"{where}: layer {d.number}: media type {d.media_type!r} is not a Docker model-spec "
                               f"layer ({', '.join([*NAMES_BY_MEDIA_TYPE, *DOCKER_TARS])})", subject=where)
        key = next((k for k in (*MODELPACK_FILEPATHS, TITLE) if k in d.annotations), None)
        if key is not None:
            layers.append(_named(d, d.annotations[key], key, where))
        else:
            unnamed.setdefault(NAMES_BY_MEDIA_TYPE[d.media_type], []).append(d)
    for name, group in unnamed.items():
        for i, d in enumerate(group):
            layers.append(_named(d, _nth_name(name, i, len(group)), "media type", where))
    return sorted(layers, key=lambda layer: layer.number)


def _nth_name(name: str, i: int, count: int) -> str:
    """The ``i``th of ``count`` files named ``name``: shards of weights as
    llama.cpp and Hugging Face number them, any other file ``NAME-2``..."""
    if count > 1 and name in _SHARDED:
        stem, dot, suffix = name.partition(".")
        return f"{stem}-{i + 1:05d}-of-{count:05d}{dot}{suffix}"
    return numbered_name(name, i)


def _kitops_layer(d: Descriptor, where: str) -> ModelLayer:
    match = _KITOPS_LAYER.fullmatch(d.media_type)
    if match is None:
        raise InvalidInput(f"{where}: layer {d.number}: media type {d.media_type!r} is not a KitOps ModelKit layer "
                           f"(application/vnd.kitops.modelkit.<kind>.v1.tar[+gzip|+zstd])", subject=where)
    return _tar(d, _compression(match.group(2) or ""))


def _ollama_layers(descriptors: list[Descriptor], where: str) -> list[ModelLayer]:
    names = ollama_file_names([d.media_type for d in descriptors], where)
    return [_named(d, name, "media type", where) for d, name in zip(descriptors, names, strict=True)]


def _oras_layer(d: Descriptor, where: str) -> ModelLayer:
    layer = _named(d, d.annotations[TITLE], TITLE, where)
    if ORAS_UNPACK not in d.annotations:
        return layer
    suffix = d.media_type[d.media_type.rfind("+"):] if "+" in d.media_type else ""
    return _tar(d, _compression(suffix) if suffix in ("+gzip", "+zstd") else SNIFF)


def _checked(fmt: str, layers: list[ModelLayer], where: str, config: Descriptor | None = None) -> ModelArtifact:
    """The artifact, once no two raw layers name one path and one digest has one size."""
    if not layers:
        raise InvalidInput(f"{where}: the {fmt} artifact has no layers", subject=where)
    paths: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for layer in layers:
        if layer.path is not None and not layer.is_tar:
            if layer.path in paths:
                raise InvalidCarton(layer.path, f"{where}: layers {paths[layer.path]} and {layer.number} both "
                                                f"have this path")
            paths[layer.path] = layer.number
        if sizes.setdefault(layer.digest, layer.size) != layer.size:
            raise InvalidInput(f"{where}: the manifest gives {layer} two sizes ({sizes[layer.digest]} and "
                               f"{layer.size})", subject=where)
    return ModelArtifact(fmt, tuple(layers), config)


MAX_CONFIG_SIZE = 1 << 20
"""A model config is a few KiB of JSON; more is not read."""


def weights_format(config_raw: bytes, where: str) -> tuple[str | None, str | None]:
    """``config.format`` (the weights' format) and the description a
    ModelPack or Docker model config gives, each None where it says none."""
    doc = json_object(config_raw, "the model config", where)
    config: dict[str, Any] = doc["config"] if isinstance(doc.get("config"), dict) else {}
    descriptor: dict[str, Any] = doc["descriptor"] if isinstance(doc.get("descriptor"), dict) else {}
    fmt, description = config.get("format"), descriptor.get("description")
    fmt = fmt.strip().lower() if isinstance(fmt, str) and re.fullmatch(r"[\w.+-]{1,64}", fmt.strip()) else None
    return fmt, description if isinstance(description, str) and description.strip() else None
