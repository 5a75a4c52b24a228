"""What ``cartonstore inspect`` reports about a carton in the store, or a
carton file or directory read where it is."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from cartonstore.carton.from_files import MODEL_FOLDER, format_of_path
from cartonstore.carton.model_files import HEADER_READERS, describe_model_file, header_text
from cartonstore.errors import InvalidInput, NotFound
from cartonstore.format.dtypes import carton_dtype_to_v2, shape_to_v2_dims
from cartonstore.format.tensor_data import parse_tensor_index
from cartonstore.format.units import format_size
from cartonstore.store import Store
from cartonstore.store.store import no_such_source

if TYPE_CHECKING:
    from cartonstore.format.carton_toml import CartonConfig, TensorSpec
    from cartonstore.format.entry import EntryRow
    from cartonstore.format.tensor_data import TensorEntry


def _tensor_specs(specs: Sequence[TensorSpec] | None) -> list[dict[str, Any]] | None:
    if specs is None:
        return None
    return [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape) if isinstance(s.shape, tuple) else s.shape,
             "datatype": carton_dtype_to_v2(s.dtype), "dims": shape_to_v2_dims(s.shape),
             "description": s.description} for s in specs]


def _tensor_rows(tensors: Iterable[TensorEntry]) -> list[dict[str, Any]]:
    return [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape) if t.shape is not None else None,
             "file": t.file, "inner": list(t.inner) if t.inner else None} for t in tensors]


def _tensor_data(store: Store, digest: str) -> list[dict[str, Any]]:
    entry = next((e for e in store.index.entries(digest) if e.path == "tensor_data/index.toml"), None)
    if entry is None or not store.blobs.has(entry.digest):
        return []
    return _tensor_rows(parse_tensor_index(store.blobs.path(entry.digest).read_bytes()))


def _described(digest: str, cfg: CartonConfig, entries: Sequence[EntryRow], present: set[str],
               **rest: Any) -> dict[str, Any]:
    """The report's shape, for a carton of the store and a carton file alike:
    ``present`` holds the paths whose bytes are at hand."""
    return {
        "manifest_sha256": digest,
        "model_name": cfg.model_name,
        "short_description": cfg.short_description,
        "license": cfg.license,
        "repository": cfg.repository,
        "homepage": cfg.homepage,
        "required_platforms": list(cfg.required_platforms),
        "runner": {"runner_name": cfg.runner.runner_name,
                   "required_framework_version": cfg.runner.required_framework_version,
                   "runner_compat_version": cfg.runner.runner_compat_version,
                   "opts": cfg.runner.opts},
        "inputs": _tensor_specs(cfg.inputs),
        "outputs": _tensor_specs(cfg.outputs),
        "self_tests": len(cfg.self_tests),
        "examples": len(cfg.examples),
        "files": [{"path": e.path, "sha256": e.digest, "size": e.size, "kind": e.kind,
                   "target": e.target, "present": e.path in present} for e in entries],
        **rest,
    }


def _model_files(entries: Sequence[EntryRow], opener: Callable[[EntryRow], Callable[[], BinaryIO] | None]
                 ) -> list[dict[str, Any]]:
    """Each file under model/: its format and size, and its header's summary where it has one."""
    return [describe_model_file(e.path, e.size or 0, opener(e))
            for e in entries if e.kind == "file" and e.path.startswith(MODEL_FOLDER)]


def describe_carton(store: Store, digest: str) -> dict[str, Any]:
    info = store.info(digest)
    entries = store.index.entries(digest)

    held = {d for d in {e.digest for e in entries if e.digest} if store.blobs.has(d)}

    def opener(e: EntryRow) -> Callable[[], BinaryIO] | None:
        blob = store.blobs.path(e.digest)
        return (lambda: blob.open("rb")) if e.digest in held else None
    return _described(digest, store.config_of(digest), entries, {e.path for e in entries if e.digest in held},
                      names=info.names, complete=info.complete, missing_blobs=info.missing_blobs,
                      path=str(info.model_dir) if info.model_dir else None, size=info.row.total_size,
                      tensor_data=_tensor_data(store, digest), safetensors=store.safetensors_of(digest),
                      model_files=_model_files(entries, opener))


def describe_ref(store: Store, ref: str) -> dict[str, Any]:
    """A carton of the store by REF; else a local carton file or directory,
    read where it is (the store gains nothing)."""
    try:
        return describe_carton(store, store.resolve(ref))
    except NotFound as e:
        if not os.path.exists(ref):
            raise no_such_source(ref) or e from None
    if os.path.isfile(ref) and format_of_path(ref) in HEADER_READERS:
        return describe_file(Path(ref))
    return describe_source(store, Path(ref))


def describe_file(path: Path) -> dict[str, Any]:
    """A model file outside the store (a .safetensors or .gguf file): its
    header, read where it is; a broken header is refused, naming what is wrong."""
    described = describe_model_file(str(path), path.stat().st_size, lambda: path.open("rb"))
    if described["problem"]:
        raise InvalidInput(described["problem"], subject=str(path))
    return {"source": str(path), **described}


def describe_source(store: Store, path: Path) -> dict[str, Any]:
    """A carton file or directory as it is: checked as add checks it,
    its blobs not hashed (what add would store is known only then); the
    store's names and model directory for it where the store holds it."""
    from cartonstore.carton.checks import check_carton, check_safetensors, compute_manifest, is_safetensors
    from cartonstore.sources import DirCartonView, open_local

    view = open_local(path, store.zip_limits)
    try:
        raw = view.read_metadata("MANIFEST")
        checked = check_carton(view, manifest_raw=raw if raw is not None or not isinstance(view, DirCartonView)
                               else compute_manifest(view))
        files = {e.path: e for e in checked.entries if e.kind == "file" and e.path in checked.present}
        safetensors = {p: [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in
                           check_safetensors(p, functools.partial(view.open, p), e.size or 0).tensors]
                       for p, e in files.items() if is_safetensors(p)}
        model_files = _model_files(checked.entries,
                                   lambda e: functools.partial(view.open, e.path) if e.path in files else None)
    finally:
        view.close()
    digest = checked.digest
    known = store.index.carton(digest) is not None
    model = store.layout.model_path(digest)
    missing = sorted({e.digest for e in checked.entries if e.kind == "file" and e.path not in checked.present})
    sizes = [e.size for e in checked.entries if e.kind == "file"]
    return _described(digest, checked.config, checked.entries, set(files) | {e.path for e in checked.entries
                                                                            if e.kind == "symlink"},
                      names=store.index.names_of(digest) if known else [], complete=not missing,
                      missing_blobs=missing, path=str(model) if known and model.is_dir() else None,
                      size=None if None in sizes else sum(sizes), tensor_data=_tensor_rows(checked.tensors),
                      safetensors=safetensors, model_files=model_files, source=str(path), in_store=known)


def _total(d: dict[str, Any]) -> str:
    """The carton's size, or what is known of it while linked files are not fetched yet."""
    if d["size"] is not None:
        return format_size(d["size"])
    unknown = [f for f in d["files"] if f["kind"] == "file" and f["size"] is None]
    known = sum(f["size"] or 0 for f in d["files"] if f["kind"] == "file")
    return f"? ({format_size(known)} known; {len(unknown)} linked file(s) not fetched yet)"


def _model_file_line(f: dict[str, Any]) -> str:
    line = f"  {f['format'] or '-':12} {format_size(f['size']):>10}  {f['path']}"
    summary = header_text(f)
    return line + (f"  {summary}" if summary else "")


def render_text(d: dict[str, Any]) -> str:
    if "manifest_sha256" not in d:   # one model file, outside the store
        return f"file:      {d['source']}\nformat:    {d['format']}\nsize:      {format_size(d['size'])}\n" \
               f"header:    {header_text(d)}"
    state = "complete" if d["complete"] else f"{len(d['missing_blobs'])} blob(s) missing"
    if d["path"]:
        state += f", materialized at {d['path']}"
    lines = [f"model:     {d['model_name'] or '(unnamed)'}", f"names:     {', '.join(d['names']) or '-'}",
             f"runner:    {d['runner']['runner_name']} {d['runner']['required_framework_version']}",
             f"state:     {state}", f"size:      {_total(d)}"]
    if d["short_description"]:
        lines.append(f"about:     {d['short_description']}")
    for kind in ("inputs", "outputs"):
        for t in d[kind] or []:
            lines.append(f"{kind[:-1]:9}  {t['name']}: {t['datatype']} {t['dims']}")
    lines.append(f"files ({len(d['files'])}):")
    for f in d["files"]:
        size = "link" if f["kind"] == "symlink" else (f["size"] if f["size"] is not None else "?")
        lines.append(f"  {f['sha256'][:12]}  {size:>12}  {f['path']}" + (f" -> {f['target']}" if f["target"] else "")
                     + ("" if f["present"] else "  (not present)"))
    for t in d["tensor_data"]:
        lines.append(f"tensor_data  {t['name']}: {t['dtype']} {t['shape'] if t['shape'] is not None else t['inner']}")
    if any(f["format"] for f in d["model_files"]):
        lines.append("model files:")
        lines += [_model_file_line(f) for f in d["model_files"]]
    for path, tensors in d["safetensors"].items():
        lines.append(f"safetensors {path} ({len(tensors)} tensors):")
        lines += [f"  {t['name']}: {t['dtype']} {t['shape']}" for t in tensors]
    lines.append(d["manifest_sha256"])
    return "\n".join(lines)
