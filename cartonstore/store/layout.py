"""Where things live under a store root (DESIGN.md, "On disk")."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from cartonstore.format.digest import is_sha256


@dataclass(frozen=True)
class StoreLayout:
    root: Path

    @property
    def index_db(self) -> Path:
        return self.root / "index.db"

    @property
    def blobs_dir(self) -> Path:
        return self.root / "blobs" / "sha256"

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    @property
    def locks_dir(self) -> Path:
        return self.root / "locks"

    @property
    def quarantine_dir(self) -> Path:
        return self.root / "quarantine"

    def blob_path(self, digest: str) -> Path:
        if not is_sha256(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return self.blobs_dir / digest[:2] / digest

    def model_path(self, digest: str) -> Path:
        if not is_sha256(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return self.models_dir / digest

    def model_dir_str(self, digest: str) -> str:
        """model_path as a str, for a digest read from the index (already a
        sha256): leases are answered thousands of times a second, and
        building and checking a Path was 7% of the daemon's time."""
        return self._models_prefix + digest

    @cached_property
    def _models_prefix(self) -> str:
        return f"{self.models_dir}{os.sep}"

    def create(self) -> None:
        """Make the directory skeleton; group-readable so a group can share it."""
        for d in (self.blobs_dir, self.models_dir, self.tmp_dir, self.locks_dir):
            d.mkdir(parents=True, exist_ok=True)


SOCKET_NAME = "cartonstore.sock"
"""The daemon's socket in a store root, unless server.socket says otherwise."""


def default_root() -> Path:
    """$CARTONSTORE_ROOT, else the user's cache dir (XDG_CACHE_HOME or ~/.cache)."""
    env = os.environ.get("CARTONSTORE_ROOT")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "cartonstore"
