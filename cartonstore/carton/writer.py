"""Write a .carton zip from a checked carton and a view that supplies bytes.

Used by ``pack`` (from a directory) and ``export`` (from the store). The
output is written beside its destination and renamed, so a reader never
sees half a carton.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cartonstore.errors import InvalidInput, Unavailable
from cartonstore.format.links import build_links
from cartonstore.sources.view import CartonView
from cartonstore.zipfmt import COMPRESSION_METHODS, STORED, ZipWriter

from .checks import CheckedCarton

# Small metadata stays in the zip even when linking, so a carton is
# always "known" from the zip alone.
ALWAYS_INLINE = frozenset({"carton.toml", "tensor_data/index.toml"})


@dataclass(frozen=True)
class WrittenCarton:
    path: Path
    digest: str
    files_inline: int
    files_linked: int
    size: int


def plan_links(checked: CheckedCarton, *, url_prefix: str, min_size: int) -> dict[str, tuple[str, ...]]:
    """LINKS for every file of at least ``min_size`` bytes: <prefix>/<sha256>."""
    prefix = url_prefix.rstrip("/")
    if not prefix.startswith(("http://", "https://")):
        raise InvalidInput(f"link prefix must be an http(s) URL, got {url_prefix!r}")
    return {
        e.digest: (f"{prefix}/{e.digest}",)
        for e in checked.entries
        if e.kind == "file" and e.path not in ALWAYS_INLINE and (e.size or 0) >= min_size
    }


def write_carton(out: Path, checked: CheckedCarton, view: CartonView, *, compression: str = "zstd",
                 links: dict[str, tuple[str, ...]] | None = None) -> WrittenCarton:
    """Write the carton; files whose digest is in ``links`` are left out of
    the zip. An ``out`` that is a symlink is written through (its target)."""
    try:
        method = COMPRESSION_METHODS[compression]
    except KeyError:
        raise InvalidInput(f"unknown compression {compression!r} (choose zstd, deflate or stored)") from None
    links = dict(links or {})
    if out.is_symlink():  # write the file it points to, as a shell's > would
        out = Path(os.path.realpath(out))
    check_destination(out)
    order = sorted(checked.entries, key=lambda e: (e.path != "carton.toml", e.path.encode()))
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}.tmp")
    inline = linked = 0
    try:
        with ZipWriter(tmp) as zw:
            for e in order:
                src = view.files.get(e.path)
                if src is not None and src.kind == "symlink":
                    zw.add_symlink(e.path, src.target or "")
                    inline += 1
                elif e.digest in links or src is None:
                    if e.digest not in links:
                        raise InvalidInput(f"{e.path} (sha256 {e.digest}) is not available and has no link")
                    linked += 1
                else:
                    with view.open(e.path) as f:
                        zw.add_file(e.path, f, method=method, size=src.size)
                    inline += 1
            zw.add_bytes("MANIFEST", checked.manifest.raw, method=STORED)
            if links:
                zw.add_bytes("LINKS", build_links(links), method=method)
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise Unavailable(f"cannot write {out}: {e.strerror}", subject=str(out)) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return WrittenCarton(out, checked.digest, inline, linked, out.stat().st_size)


def check_destination(out: Path) -> None:
    """Refuse (InvalidInput) an output path that cannot be written because
    of what the user typed: a missing directory, a directory as the file."""
    parent = out.parent
    if not parent.exists():
        raise InvalidInput(f"cannot write {out}: directory {parent} does not exist", subject=str(out))
    if not parent.is_dir():
        raise InvalidInput(f"cannot write {out}: {parent} is not a directory", subject=str(out))
    if out.is_dir():
        raise InvalidInput(f"cannot write {out}: it is a directory (give a file name, e.g. {out / 'model.carton'})",
                           subject=str(out))
