"""What collection, holds and verification operate on: the root and its layout,
the blob files, the index, the store lock, and taking a model directory
away whole. ``Store`` (store/store.py) is what they are handed; they name
this protocol instead, so that they never import the facade that calls
them."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from cartonstore.store.content.blobs import BlobStore
from cartonstore.store.metadata.index import Index
from cartonstore.store.root.layout import StoreLayout
from cartonstore.store.root.locks import FileLock


class StoreParts(Protocol):
    layout: StoreLayout
    blobs: BlobStore
    index: Index

    @property
    def root(self) -> Path: ...

    def lock(self, *, shared: bool = False) -> FileLock: ...

    def take_model_away(self, digest: str) -> Path | None: ...
