"""Whole-carton validation, shared by ingest, pack and export.

The format parsers check one file each; this module checks that the files
of a carton agree with one another: zip entries vs MANIFEST vs LINKS,
symlinks, carton.toml references, tensor_data, and safetensors headers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from cartonstore.errors import InvalidCarton, ManifestMismatch
from cartonstore.format.carton_toml import CartonConfig, check_references, parse_carton_toml
from cartonstore.format.entry import EntryRow
from cartonstore.format.links import parse_links
from cartonstore.format.manifest import Manifest, build_manifest, parse_manifest
from cartonstore.format.paths import resolve_symlink_target
from cartonstore.format.safetensors import SafetensorsHeader, parse_header_size, parse_safetensors
from cartonstore.format.tensor_data import (
    TensorEntry,
    check_tensor_files,
    check_tensor_index_present,
    parse_tensor_index,
    string_data,
)
from cartonstore.sources.view import METADATA_LIMITS, STRING_TENSOR_LIMIT, CartonView, read_limited


@dataclass(frozen=True)
class CheckedCarton:
    """A carton whose metadata agree with each other. Blob bytes are
    verified later, as they stream into the store."""

    manifest: Manifest
    config: CartonConfig
    links: dict[str, tuple[str, ...]]
    entries: tuple[EntryRow, ...]
    tensors: tuple[TensorEntry, ...] = ()
    # paths whose bytes the source holds (files, not symlinks or linked-only)
    present: frozenset[str] = field(default_factory=frozenset)

    @property
    def digest(self) -> str:
        return self.manifest.digest

    def files_by_digest(self) -> dict[str, str]:
        """One source path per blob the source can supply."""
        out: dict[str, str] = {}
        for e in self.entries:
            if e.kind == "file" and e.path in self.present:
                out.setdefault(e.digest, e.path)
        return out


def hash_stream(stream: BinaryIO) -> str:
    h = hashlib.sha256()
    while chunk := stream.read(1 << 20):
        h.update(chunk)
    return h.hexdigest()


def compute_manifest(view: CartonView, hash_file: Callable[[str], str] | None = None) -> bytes:
    """MANIFEST for a directory that has none (pack, unpacked sources).
    A kept symlink is listed with the hash of the file it resolves to.
    ``hash_file(path)`` hashes one file (ingest stages it in the same read)."""
    if "carton.toml" not in view.files:
        raise InvalidCarton("carton.toml", f"missing from {view.label}: every carton must have one")
    digests: dict[str, str] = {}
    for path, f in view.files.items():
        if f.kind == "file":
            if hash_file is not None:
                digests[path] = hash_file(path)
                continue
            with view.open(path) as s:
                digests[path] = hash_stream(s)
    for path, f in view.files.items():
        if f.kind == "symlink":
            digests[path] = digests.get(_resolve_link_chain(view, path), "")
            if not digests[path]:
                raise InvalidCarton(path, f"symlink to {f.target!r} does not resolve to a file of the carton")
    return build_manifest(digests)


def check_carton(view: CartonView, *, manifest_raw: bytes | None = None,
                 links_raw: bytes | None = None, top_level: bool = True) -> CheckedCarton:
    """Validate a carton's metadata and structure; raises InvalidCarton.
    ``manifest_raw`` / ``links_raw`` override what the view holds (b"" for
    "no LINKS"). ``top_level``: refuse entries outside the format. That is
    checked on the way in; a carton the store already holds (exported, or
    re-read to bring evicted blobs back) is taken as it was accepted."""
    raw = manifest_raw if manifest_raw is not None else view.read_metadata("MANIFEST")
    if raw is None:
        raise InvalidCarton("MANIFEST", "missing: every carton must have one")
    manifest = parse_manifest(raw)
    if top_level:
        check_top_level(view, manifest.as_dict())
    if links_raw is None:
        links_raw = view.read_metadata("LINKS")
    links = parse_links(links_raw) if links_raw else {}
    listed = manifest.as_dict()
    _check_membership(view, listed, links)
    _check_symlinks(view, listed)
    config = _read_config(view, listed)
    tensors = _check_tensor_data(view, listed)
    check_references(config, set(listed), {t.name for t in tensors})
    entries = tuple(
        EntryRow(p, d, _size_of(view, p), view.files[p].kind if p in view.files else "file",
                 view.files[p].target if p in view.files else None)
        for p, d in manifest.entries
    )
    present = frozenset(p for p, f in view.files.items() if f.kind == "file")
    return CheckedCarton(manifest, config, links, entries, tensors, present)


# What a carton holds at its top level (Carton's format v1, docs/specification/format.md, "Each
# carton contains the following"); MANIFEST and LINKS are read as metadata.
TOP_LEVEL_FILES = frozenset({"carton.toml", "MANIFEST", "LINKS"})
TOP_LEVEL_FOLDERS = frozenset({"model", "tensor_data", "misc"})


def outside_the_format(paths: Iterable[str]) -> list[str]:
    """Top-level entries (``name`` or ``folder/``) that are not part of a carton."""
    out = set()
    for path in paths:
        top, sep, _ = path.partition("/")
        if (top not in TOP_LEVEL_FOLDERS) if sep else (top not in TOP_LEVEL_FILES):
            out.add(top + sep)
    return sorted(out)


def check_top_level(view: CartonView, listed: dict[str, str]) -> None:
    """Refuse entries outside the format (a stale out.carton, notes.txt, .git/),
    whether in the source or only in MANIFEST, naming each."""
    extra = outside_the_format([*view.files, *listed])
    if extra:
        shown = ", ".join(extra[:10]) + (f" and {len(extra) - 10} more" if len(extra) > 10 else "")
        raise InvalidCarton(shown, f"outside the carton format, in {view.label}: a carton holds only "
                                   "carton.toml, MANIFEST, LINKS, model/, tensor_data/ and misc/ at its top level")


def _size_of(view: CartonView, path: str) -> int | None:
    f = view.files.get(path)
    return f.size if f is not None and f.kind == "file" else None


def _check_membership(view: CartonView, listed: dict[str, str], links: dict[str, Any]) -> None:
    for path in view.files:
        if path not in listed:
            raise InvalidCarton(path, "is in the carton but not listed in MANIFEST")
    for path, digest in listed.items():
        if path not in view.files and digest not in links:
            raise InvalidCarton(path, f"is listed in MANIFEST (sha256 {digest}) but is neither "
                                      "in the carton nor in LINKS")


def _resolve_link_chain(view: CartonView, path: str) -> str:
    seen = {path}
    current = path
    while (f := view.files.get(current)) is not None and f.kind == "symlink":
        current = resolve_symlink_target(current, f.target or "")
        if current in seen:
            raise InvalidCarton(path, "symlink loop")
        seen.add(current)
    return current


def _check_symlinks(view: CartonView, listed: dict[str, str]) -> None:
    for path, f in view.files.items():
        if f.kind != "symlink":
            continue
        final = _resolve_link_chain(view, path)
        if final not in listed:
            raise InvalidCarton(path, f"symlink to {f.target!r} does not resolve to a file of the carton")
        if listed[final] != listed[path]:
            raise InvalidCarton(path, f"symlink resolves to {final} (sha256 {listed[final]}) but "
                                      f"MANIFEST says {listed[path]}")


def _read_checked(view: CartonView, path: str, listed: dict[str, str], limit: int) -> bytes:
    if path not in view.files:
        raise InvalidCarton(path, "must be inside the carton itself, not only in LINKS")
    data = read_limited(view, path, limit)
    actual = hashlib.sha256(data).hexdigest()
    if actual != listed[path]:
        raise ManifestMismatch(path, f"bytes hash to sha256 {actual} but MANIFEST says {listed[path]}")
    return data


def _read_config(view: CartonView, listed: dict[str, str]) -> CartonConfig:
    if "carton.toml" not in listed:
        raise InvalidCarton("carton.toml", "missing: every carton must have one")
    return parse_carton_toml(_read_checked(view, "carton.toml", listed, METADATA_LIMITS["carton.toml"]))


def _check_tensor_data(view: CartonView, listed: dict[str, str]) -> tuple[TensorEntry, ...]:
    index_path = "tensor_data/index.toml"
    if not check_tensor_index_present(listed):
        return ()
    tensors = parse_tensor_index(_read_checked(view, index_path, listed, METADATA_LIMITS[index_path]))
    sizes = {p: f.size for p, f in view.files.items() if f.kind == "file" and f.size is not None}
    check_tensor_files(tensors, set(listed), sizes)
    for t in tensors:
        path = f"tensor_data/{t.file}" if t.file else None
        if t.dtype == "string" and path in view.files:
            string_data(t, _read_checked(view, path, listed, STRING_TENSOR_LIMIT))
    return tensors


def check_safetensors(path: str, open_bytes: Callable[[], BinaryIO], size: int) -> SafetensorsHeader:
    """Validate a *.safetensors file's header against its size (reads only the header)."""
    with open_bytes() as f:
        first = f.read(8)
        n = parse_header_size(first, size, file=path)
        return parse_safetensors(first + f.read(n), size, file=path)


def is_safetensors(path: str) -> bool:
    return path.endswith(".safetensors")
