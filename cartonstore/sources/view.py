"""A uniform, read-only view of a carton's files, whatever holds them.

Ingest, pack and export all work on a CartonView, so validation is written
once. A view lists the carton's files (everything but MANIFEST and LINKS,
which are read as metadata) and opens each as a stream of decoded bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Protocol

from cartonstore.errors import InvalidCarton

# Metadata is read whole into memory, so each has a ceiling: a hostile
# carton cannot make us buffer gigabytes by calling its index a MANIFEST.
METADATA_LIMITS = {
    "MANIFEST": 64 << 20,
    "LINKS": 64 << 20,
    "carton.toml": 4 << 20,
    "tensor_data/index.toml": 16 << 20,
}
STRING_TENSOR_LIMIT = 64 << 20
SYMLINK_TARGET_LIMIT = 4096


@dataclass(frozen=True)
class SourceFile:
    path: str               # validated carton path
    kind: str               # "file" or "symlink"
    size: int | None        # decoded size when known up front
    target: str | None = None  # relative link target, for symlinks


class CartonView(Protocol):
    label: str
    files: dict[str, SourceFile]

    def read_metadata(self, name: str) -> bytes | None:
        """MANIFEST or LINKS bytes, or None when the carton has none."""

    def open(self, path: str) -> BinaryIO:
        """Decoded bytes of a file (not a symlink) as a stream."""

    def close(self) -> None: ...


def read_limited(view: CartonView, path: str, limit: int) -> bytes:
    """Read a whole small file of the carton, refusing more than ``limit`` bytes."""
    f = view.files.get(path)
    if f is None:
        raise InvalidCarton(path, "missing from the carton")
    if f.size is not None and f.size > limit:
        raise InvalidCarton(path, f"is {f.size} bytes, more than the {limit} allowed for this file")
    with view.open(path) as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise InvalidCarton(path, f"is more than the {limit} bytes allowed for this file")
    return data
