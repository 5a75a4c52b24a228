"""Local carton sources: a .carton file or an unpacked directory."""

from __future__ import annotations

from pathlib import Path

from cartonstore.zipfmt import ZipLimits

from .dir_source import DirCartonView
from .view import CartonView, SourceFile, read_limited
from .zip_source import ZipCartonView


def open_local(path: Path, zip_limits: ZipLimits | None = None, *, confined: bool = False) -> CartonView:
    """A view of a local .carton file or carton directory; ``confined``: a
    directory's symlinks may not leave it (DirCartonView)."""
    return DirCartonView(path, confined=confined) if path.is_dir() else ZipCartonView(path, zip_limits)


__all__ = ["CartonView", "DirCartonView", "SourceFile", "ZipCartonView", "open_local", "read_limited"]
