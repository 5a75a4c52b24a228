"""Local carton sources: a .carton file or an unpacked directory."""

from __future__ import annotations

from pathlib import Path

from cartonstore.system.callers import OWN_RIGHTS, OwnRights
from cartonstore.zipfmt import ZipLimits

from .dir_source import DirCartonView
from .view import CartonView, SourceFile, read_limited
from .zip_source import ZipCartonView


def open_local(path: Path, zip_limits: ZipLimits | None = None, *, confined: bool = False,
               rights: OwnRights = OWN_RIGHTS) -> CartonView:
    """A view of a local .carton file or carton directory; ``confined``: a
    directory's symlinks may not leave it (DirCartonView); ``rights``: whose
    rights every look at the source is made with (a caller's, for a path a
    caller named to the daemon: cartonstore.system.callers)."""
    if rights.run(path.is_dir):
        return DirCartonView(path, confined=confined, rights=rights)
    return ZipCartonView(path, zip_limits, rights=rights)


__all__ = ["CartonView", "DirCartonView", "SourceFile", "ZipCartonView", "open_local", "read_limited"]
