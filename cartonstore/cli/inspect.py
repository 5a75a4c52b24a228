"""What ``cartonstore inspect`` reports about a carton in the store."""

from __future__ import annotations

from typing import Any

from cartonstore.format.dtypes import carton_dtype_to_v2, shape_to_v2_dims
from cartonstore.format.tensor_data import parse_tensor_index
from cartonstore.format.units import format_size
from cartonstore.store import Store


def _tensor_specs(specs) -> list[dict[str, Any]] | None:  # noqa: ANN001
    if specs is None:
        return None
    return [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape) if isinstance(s.shape, tuple) else s.shape,
             "datatype": carton_dtype_to_v2(s.dtype), "dims": shape_to_v2_dims(s.shape),
             "description": s.description} for s in specs]


def _tensor_data(store: Store, digest: str) -> list[dict[str, Any]]:
    entry = next((e for e in store.index.entries(digest) if e.path == "tensor_data/index.toml"), None)
    if entry is None or not store.blobs.has(entry.digest):
        return []
    tensors = parse_tensor_index(store.blobs.path(entry.digest).read_bytes())
    return [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape) if t.shape is not None else None,
             "file": t.file, "inner": list(t.inner) if t.inner else None} for t in tensors]


def describe_carton(store: Store, digest: str) -> dict[str, Any]:
    info = store.info(digest)
    cfg = store.config_of(digest)
    entries = store.index.entries(digest)
    return {
        "manifest_sha256": digest,
        "names": info.names,
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
        "complete": info.complete,
        "missing_blobs": info.missing_blobs,
        "path": str(info.model_dir) if info.model_dir else None,
        "size": info.row.total_size,
        "files": [{"path": e.path, "sha256": e.digest, "size": e.size, "kind": e.kind,
                   "target": e.target, "present": store.blobs.has(e.digest)} for e in entries],
        "tensor_data": _tensor_data(store, digest),
        "safetensors": store.safetensors_of(digest),
    }


def _total(d: dict[str, Any]) -> str:
    """The carton's size, or what is known of it while linked files are not fetched yet."""
    if d["size"] is not None:
        return format_size(d["size"])
    unknown = [f for f in d["files"] if f["kind"] == "file" and f["size"] is None]
    known = sum(f["size"] or 0 for f in d["files"] if f["kind"] == "file")
    return f"? ({format_size(known)} known; {len(unknown)} linked file(s) not fetched yet)"


def render_text(d: dict[str, Any]) -> str:
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
    for path, tensors in d["safetensors"].items():
        lines.append(f"safetensors {path} ({len(tensors)} tensors):")
        lines += [f"  {t['name']}: {t['dtype']} {t['shape']}" for t in tensors]
    lines.append(d["manifest_sha256"])
    return "\n".join(lines)
