"""A carton of model files as other tools keep them: a Hugging Face
repository, an OCI model artifact (ModelPack, Docker model-spec, KitOps,
ORAS, Ollama), a directory adopted in place.

Each file keeps its own path, under ``model/`` (the carton format's folder
for "whatever the runner needs"), so ``cartonstore path NAME`` + ``/model``
is the repository as its tool wrote it. carton.toml is generated: its
``runner_name`` names the files' format (``safetensors``, ``gguf``,
``pytorch``, ``files``...). No cartonstore runner serves those formats, so
such a carton loads as files only and is used through a lease
(``cartonstore path``, POST /v1/leases); where a runner can serve the files,
a source writes the runnable declaration instead (``pack``'s, from_model.py).

Pure: callers hand in each file's digest and size, read from wherever the
files are, and get the carton's small files (carton.toml, MANIFEST) and the
CartonView that check_carton reads.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import BinaryIO

from cartonstore.errors import InvalidCarton
from cartonstore.format.manifest import build_manifest
from cartonstore.format.paths import carton_path_problem
from cartonstore.sources.view import SourceFile

MODEL_FOLDER = "model/"
FORMAT_BY_SUFFIX = {
    ".safetensors": "safetensors",
    ".gguf": "gguf",
    ".onnx": "onnx",
    ".pt": "pytorch",
    ".pth": "pytorch",
    ".bin": "pytorch",
    ".ckpt": "pytorch",
    ".h5": "keras",
    ".keras": "keras",
    ".tflite": "tflite",
    ".msgpack": "flax",
    ".mlmodel": "coreml",
    ".npz": "numpy",
}
"""The weight formats a file's suffix names; ``files`` where none of the
files has one (a tokenizer, a dataset)."""
RUNNERLESS_FORMATS = frozenset(FORMAT_BY_SUFFIX.values()) - {"onnx"} | {"files"}
"""The runner_names a files carton gives that no cartonstore runner serves
(the onnx runner serves .onnx graphs)."""
ANY_VERSION = ">=0.0.0"
"""required_framework_version of a format no cartonstore runner serves: any."""


def format_of_path(path: str) -> str | None:
    """The weight format a file's suffix names; None for any other file."""
    base = path.rsplit("/", 1)[-1]
    return FORMAT_BY_SUFFIX.get(base[base.rfind("."):].lower()) if "." in base else None


def format_of_files(sizes: Mapping[str, int]) -> str:
    """The format of the files that hold most of the bytes (the weights,
    not the tokenizer beside them); ``files`` when no suffix names one."""
    by_format: dict[str, int] = {}
    for path, size in sizes.items():
        fmt = format_of_path(path)
        if fmt is not None:
            by_format[fmt] = by_format.get(fmt, 0) + size
    if not by_format:
        return "files"
    return max(sorted(by_format), key=lambda fmt: by_format[fmt])


def no_runner_serves(fmt: str) -> str:
    """Why a carton of ``fmt`` files does not run, and how to use it."""
    return f"no runner serves {fmt}; lease it with `cartonstore path` or POST /v1/leases"


def model_file_path(path: str, *, origin: str) -> str:
    """The carton path of a model file named ``path`` by its source
    (``origin``: what named it, for the error): ``model/PATH``, refused with
    the reason when ``path`` is absolute, has ``..`` or any other part a
    carton path may not have."""
    problem = carton_path_problem(path)
    if problem is not None:
        raise InvalidCarton(repr(path)[1:-1], f"({origin}) is not an allowed file path: it {problem}")
    return MODEL_FOLDER + path


def files_carton_toml(model_name: str, sizes: Mapping[str, int], *, description: str | None = None,
                      fmt: str | None = None) -> bytes:
    """carton.toml for model files no runner is declared for: spec 1, the
    name, and ``runner_name`` the files' format (``fmt`` or format_of_files)
    where no runner serves it; ``files`` where one would (an .onnx graph
    whose inputs were not read, a source's config naming a runner): a
    runner is named only by a declaration made from the files themselves
    (runnable_carton_toml), never by a name a source gave."""
    import tomli_w

    toml: dict[str, object] = {"spec_version": 1, "model_name": model_name}
    if description:
        toml["short_description"] = description
    runner_name = fmt or format_of_files(sizes)
    if runner_name not in RUNNERLESS_FORMATS:
        runner_name = "files"
    toml["runner"] = {"runner_name": runner_name, "required_framework_version": ANY_VERSION}
    return tomli_w.dumps(toml).encode()


@dataclass(frozen=True)
class ListedFile:
    """One file of a source: its sha256 and size as the source lists them."""

    digest: str
    size: int


class ListedCartonView:
    """A CartonView of files a source lists (digest and size, not yet
    fetched) whose small files (carton.toml, MANIFEST, ...) were read into
    memory: enough for check_carton, which opens only those."""

    def __init__(self, label: str, files: Mapping[str, ListedFile], small: Mapping[str, bytes],
                 metadata_names: frozenset[str] = frozenset({"MANIFEST", "LINKS"})) -> None:
        self.label = label
        self._small = dict(small)
        self.files = {path: SourceFile(path, "file", f.size)
                      for path, f in files.items() if path not in metadata_names}

    def read_metadata(self, name: str) -> bytes | None:
        return self._small.get(name)

    def open(self, path: str) -> BinaryIO:
        return io.BytesIO(self._small[path])

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class FilesCarton:
    """The carton of a set of model files: every carton path's file, the
    generated small files, and the view check_carton reads."""

    files: dict[str, ListedFile]
    """carton path -> file, carton.toml and every model file."""
    small: dict[str, bytes]
    """carton.toml and MANIFEST."""

    def view(self, label: str) -> ListedCartonView:
        return ListedCartonView(label, self.files, self.small)

    def model_files(self) -> dict[str, ListedFile]:
        """The model's files by the paths their source gave them."""
        return {path.removeprefix(MODEL_FOLDER): f for path, f in self.files.items() if path.startswith(MODEL_FOLDER)}


def files_carton(model_name: str, files: Mapping[str, ListedFile], *, origin: str,
                 description: str | None = None, fmt: str | None = None,
                 carton_toml: bytes | None = None) -> FilesCarton:
    """The carton of model files named by their source's paths (each put
    under ``model/``); carton.toml generated unless given (a runnable one)."""
    placed = {model_file_path(path, origin=origin): f for path, f in files.items()}
    if not placed:
        raise InvalidCarton(origin, "holds no files")
    toml = carton_toml if carton_toml is not None else files_carton_toml(
        model_name, {path: f.size for path, f in files.items()}, description=description, fmt=fmt)
    placed["carton.toml"] = ListedFile(hashlib.sha256(toml).hexdigest(), len(toml))
    manifest = build_manifest({path: f.digest for path, f in placed.items()})
    return FilesCarton(placed, {"carton.toml": toml, "MANIFEST": manifest})
