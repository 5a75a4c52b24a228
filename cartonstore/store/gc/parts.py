"""What every store operation works on: the root's layout, the blob files,
the index and the store lock. Store (store.py) is these parts plus the
operations a user calls; the operations kept in modules of their own
(store/gc/collect.py, verification.py, holds.py) take the parts, so that they
never import the Store facade that calls them."""

from __future__ import annotations

import os
from pathlib import Path

from cartonstore.store.content.blobs import BlobStore
from cartonstore.store.metadata.index import Index
from cartonstore.store.root.layout import StoreLayout
from cartonstore.store.root.locks import FileLock
from cartonstore.store.root.owner import tmp_name


class StoreParts:
    def __init__(self, layout: StoreLayout, blobs: BlobStore, index: Index) -> None:
        self.layout = layout
        self.blobs = blobs
        self.index = index

    @property
    def root(self) -> Path:
        return self.layout.root

    def lock(self, *, shared: bool = False) -> FileLock:
        return FileLock(self.layout.locks_dir / "store.lock", shared=shared)

    def take_model_away(self, digest: str) -> Path | None:
        """Rename a model directory into tmp/ (owned by this process) so it
        disappears whole: deleting it in place could leave, after a crash, a
        half-empty directory that the next `path` would serve as it is."""
        model = self.layout.model_path(digest)
        if not model.is_dir():
            return None
        away = tmp_name(self.layout.tmp_dir, "model")
        os.rename(model, away)
        return away
