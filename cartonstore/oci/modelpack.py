"""A stored carton as a CNCF ModelPack artifact, for push. Pure.

Follows the ModelPack model-spec v1 (github.com/modelpack/model-spec,
docs/spec.md, docs/config.md and docs/annotations.md as of release v0.0.7
and its main branch in 2026, unchanged in what is used here):

- the image manifest's ``mediaType`` is OCI's image manifest, its
  ``artifactType`` ``application/vnd.cncf.model.manifest.v1+json``;
- the config (``application/vnd.cncf.model.config.v1+json``) holds
  ``descriptor`` (name, description, licenses, sourceURL, docURL from
  carton.toml), ``config`` (``format``: the carton's ``runner_name``) and
  ``modelfs`` (``type: layers``, ``diffIds``: each layer's digest, which is
  its content's since every layer is raw);
- one raw layer per file (``application/vnd.cncf.model.<kind>.v1.raw``): the
  file itself, so its digest is the store's blob key and nothing is
  repacked, in the carton's order; each names its path in
  ``org.cncf.model.filepath`` and its attributes in
  ``org.cncf.model.file.metadata+json``. The attributes are constants (mode
  0644, uid and gid 0, no modification time), as the spec's reproducibility
  guidance asks: the store keeps content, not the files' times, and the same
  carton pushed twice is the same artifact.

Which kind a file is (weights, weight config, code, doc) is decided by its
name as modctl decides it (pkg/modelfile/constants.go, InferFileType): the
config patterns first, then weights, code and docs, each matched against
the lowercased base name; a file no pattern names is weights above 128 MB,
else code. A carton's MANIFEST is weight config: it lists the carton's
files and their hashes (modctl knows no such file and would call it code).

Which paths the artifact names: a carton of model files as other tools keep
them (from_files.py: every file under ``model/``, carton.toml naming a file
format no built-in runner serves) is pushed as the repository it holds,
``model/`` stripped and without carton.toml and MANIFEST, which cartonstore
generated and a reader generates again from ``config.format``: modctl
extracts, and a Kubernetes image volume mounts, the files where the model's
own tools look for them. Any other carton keeps its own paths (carton.toml,
MANIFEST, model/…, tensor_data/…), because its carton.toml names files by
those paths and declares what no ModelPack field holds (the runner's
inputs and outputs, self tests): extracted, it is the carton, and
``cartonstore add`` of that directory gives the same carton back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from cartonstore.carton.from_files import FORMAT_BY_SUFFIX, MODEL_FOLDER
from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import CartonConfig
from cartonstore.runner.builtin_runners import BUILTIN_RUNNERS

from .artifact import OCI_MANIFEST, Layer, layers_for

ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.cncf.model.config.v1+json"
FILEPATH = "org.cncf.model.filepath"
FILE_METADATA = "org.cncf.model.file.metadata+json"
WEIGHT, WEIGHT_CONFIG, CODE, DOC, DATASET = "weight", "weight.config", "code", "doc", "dataset"
RAW_MEDIA_TYPES = {kind: f"application/vnd.cncf.model.{kind}.v1.raw"
                   for kind in (WEIGHT, WEIGHT_CONFIG, CODE, DOC, DATASET)}
"""The raw layer media type of each kind (modctl names no file a dataset)."""
FILE_MODE = 0o644
FILES_FORMATS = frozenset(FORMAT_BY_SUFFIX.values()) | {"files"}
"""runner_name values from_files.py writes for model files."""
WEIGHT_FILE_SIZE = 128 * 1000 * 1000
"""modctl's threshold: an unnamed file larger than this is weights."""
CARTON_METADATA = ("carton.toml", "MANIFEST")


def _suffixes(words: str) -> tuple[str, ...]:
    return tuple(f"*.{word}" for word in words.split())


# modctl's name patterns, in the order it tries them, lowercased.
_KIND_PATTERNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (WEIGHT_CONFIG, (
        *_suffixes("json jsonl json5 jsonc yaml yml toml ini config cfg conf properties props prop xml xsd rng "
                   "modelcard meta tiktoken hparams params hyperparams wandb mlflow tensorboard"),
        "*tokenizer.model*", "vocab.txt", "merges.txt", "added_tokens.txt", "spiece.model", "sentencepiece*.model",
        "sentencepiece*.vocab", "tiktoken.model", "chat_template.jinja", "config.json.*")),
    (WEIGHT, (
        *_suffixes("safetensors bin pt pth mar pte pt2 ptl tflite h5 hdf hdf5 pb meta index gguf ggml ggmf ggjt "
                   "q4_0 q4_1 q5_0 q5_1 q8_0 f16 f32 ckpt checkpoint dist_ckpt tensor weights state embedding vocab "
                   "ot engine trt onnx msgpack model pkl pickle keras joblib npy npz nc mlmodel coreml mil mleap "
                   "surml llamafile caffemodel prototxt dlc circle nb arrow parquet ftz ark db"),
        "*.bin.*", "*.data-*", "*.gguf.*", "tensor[0-9]*_[0-9]*", "*.onnx_data*", "*.llamafile.*")),
    (CODE, (
        *_suffixes("py ipynb sh patch c h hxx cpp cc cxx c++ hpp hh h++ java js mjs cjs jsx ts tsx go rs swift rb "
                   "php scala kt kts r m mm f f90 f95 f03 f08 jl lua pl pm cs vb dart groovy elm erl hrl ex exs hs "
                   "lhs clj cljs cljc cl lisp lsp scm ss rkt sql psql mysql sqlite zig cu cuh bash zsh fish csh "
                   "tcsh ksh ps1 psm1 psd1 bat cmd vbs wsf applescript scpt awk sed expect env mk cmake gradle "
                   "gradle.kts sbt mill bazel bzl buck ninja gyp gypi waf gemspec so dll dylib lib a dockerfile"),
        "*.env.*", ".env*", "makefile*", "dockerfile*", "cmakelists.txt", "build.gradle*", "settings.gradle*",
        "build*", "workspace*", "buck*", "wscript*", "package.json", "package-lock.json", "yarn.lock",
        "pnpm-lock.yaml", "requirements*.txt", "pipfile*", "pyproject.toml", "setup.cfg", "tox.ini", "poetry.lock",
        "cargo.toml", "cargo.lock", "go.mod", "go.sum", "composer.json", "composer.lock", "gemfile*", "mix.exs",
        "mix.lock", "rebar.config", "rebar.lock")),
    (DOC, (
        *_suffixes("txt md pdf log doc docx docm dot dotx dotm rtf odt ott fodt pages wpd xls xlsx xlsm xlsb xlt "
                   "xltx xltm ods ots fods numbers csv ppt pptx pptm pps ppsx ppsm pot potx potm odp otp fodp key "
                   "epub mobi azw azw3 fb2 fb3 lit pdb djvu djv html htm xhtml mhtml mht xml xsl xslt tex latex "
                   "ltx bib rst asciidoc adoc textile wiki mediawiki org texi texinfo info man chm hlp xps jpg "
                   "jpeg png gif bmp tiff ico webp heic heif hevc svg mp4 mov avi mkv webm m4v flv wmv mpg mpeg"),
        "license*", "readme*", "setup*", "*requirements*", "*.tfevents*")),
)


def layer_kind(path: str, size: int) -> str:
    """The ModelPack kind of a file, by its name as modctl classifies it."""
    if path == "MANIFEST":
        return WEIGHT_CONFIG
    name = path.rsplit("/", 1)[-1].lower()
    for kind, patterns in _KIND_PATTERNS:
        if any(fnmatchcase(name, pattern) for pattern in patterns):
            return kind
    return WEIGHT if size > WEIGHT_FILE_SIZE else CODE


def is_files_carton(config: CartonConfig, paths: Sequence[str]) -> bool:
    """A carton of model files as from_files.py makes it: a file format no
    built-in runner serves, every file but carton.toml under ``model/``."""
    name = config.runner.runner_name
    # A built-in runner's name makes the carton runnable, whatever its files.
    return (name in FILES_FORMATS and name not in BUILTIN_RUNNERS
            and all(p.startswith(MODEL_FOLDER) for p in paths if p not in CARTON_METADATA))


def modelpack_layers(files: Sequence[tuple[str, str, int]], config: CartonConfig) -> list[Layer]:
    """(path, sha256 hex, size) of each MANIFEST path plus MANIFEST itself ->
    the artifact's raw layers, each at the path the artifact names it by."""
    ordered = layers_for(list(files))   # carton.toml, MANIFEST, then MANIFEST order
    if is_files_carton(config, [layer.path for layer in ordered]):
        named = [(layer.path[len(MODEL_FOLDER):], layer) for layer in ordered if layer.path not in CARTON_METADATA]
        if not named:
            raise InvalidInput(f"carton {config.model_name!r} holds no model files: a ModelPack artifact has at "
                               f"least one layer", subject=config.model_name)
    else:
        named = [(layer.path, layer) for layer in ordered]
    return [Layer(path, layer.digest, layer.size, RAW_MEDIA_TYPES[layer_kind(path, layer.size)])
            for path, layer in named]


def layer_descriptor(layer: Layer) -> dict:
    metadata = {"name": layer.path.rsplit("/", 1)[-1], "mode": FILE_MODE, "uid": 0, "gid": 0, "size": layer.size,
                "mtime": "0001-01-01T00:00:00Z", "typeflag": 0}
    return {"mediaType": layer.media_type, "digest": f"sha256:{layer.digest}", "size": layer.size,
            "annotations": {FILEPATH: layer.path, FILE_METADATA: _compact(metadata).decode()}}


@dataclass(frozen=True)
class ModelPackArtifact:
    """What a ModelPack push sends: the config blob, then the manifest."""

    config: bytes
    config_digest: str      # 64 hex digits
    manifest: bytes


def modelpack_artifact(layers: Sequence[Layer], config: CartonConfig) -> ModelPackArtifact:
    blob = _compact({"descriptor": _descriptor(config), "modelfs": {
        "type": "layers", "diffIds": [f"sha256:{layer.digest}" for layer in layers]},
        "config": {"format": config.runner.runner_name}})
    digest = hashlib.sha256(blob).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": f"sha256:{digest}", "size": len(blob)},
        "layers": [layer_descriptor(layer) for layer in layers],
    }
    return ModelPackArtifact(blob, digest, _compact(manifest))


def _descriptor(config: CartonConfig) -> dict:
    fields = {"name": config.model_name, "description": config.short_description,
              "licenses": [config.license] if config.license else None,
              "sourceURL": config.repository, "docURL": config.homepage}
    return {key: value for key, value in fields.items() if value}


def _compact(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
