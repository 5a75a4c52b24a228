"""CartonView over a carton held in the store (for export)."""

from __future__ import annotations

from typing import BinaryIO

from cartonstore.format.links import build_links
from cartonstore.sources.view import SourceFile
from cartonstore.store.content.blobs import BlobStore
from cartonstore.store.metadata.index import Index


class StoreCartonView:
    def __init__(self, index: Index, blobs: BlobStore, digest: str) -> None:
        self.label = f"store carton {digest}"
        self._blobs = blobs
        self._digest = digest
        self._paths: dict[str, str] = {}
        self.files: dict[str, SourceFile] = {}
        self._links: dict[str, tuple[str, ...]] = {}
        for e in index.entries(digest):
            if e.kind == "symlink":
                self.files[e.path] = SourceFile(e.path, "symlink", None, e.target)
            elif blobs.has(e.digest):
                self.files[e.path] = SourceFile(e.path, "file", blobs.size(e.digest))
                self._paths[e.path] = e.digest
            else:
                urls = index.links_for(e.digest)
                if urls:
                    self._links[e.digest] = tuple(urls)

    def read_metadata(self, name: str) -> bytes | None:
        if name == "MANIFEST":
            return self._blobs.path(self._digest).read_bytes()
        if name == "LINKS":
            return build_links(self._links) if self._links else None
        return None

    def open(self, path: str) -> BinaryIO:
        return open(self._blobs.path(self._paths[path]), "rb")

    def close(self) -> None:
        pass
