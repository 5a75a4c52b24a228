"""CartonView over a local .carton (zip) file."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from ..errors import InvalidCarton, NotFound
from ..format.paths import validate_carton_path
from ..zipfmt import ZipEntry, ZipLimits, ZipReader
from .view import SYMLINK_TARGET_LIMIT, SourceFile

# Carton's shrink tool wrote these two as absolute names; they are the only
# leading-slash names accepted, and only for these files.
_COMPAT_NAMES = {"/MANIFEST": "MANIFEST", "/LINKS": "LINKS"}
_METADATA = ("MANIFEST", "LINKS")


class ZipCartonView:
    def __init__(self, path: Path, limits: ZipLimits | None = None) -> None:
        self.label = str(path)
        try:
            self._zip = ZipReader(path, limits or ZipLimits())
        except FileNotFoundError:
            raise NotFound(f"no such file: {path}", subject=str(path)) from None
        except IsADirectoryError:
            raise NotFound(f"{path} is a directory, not a .carton file", subject=str(path)) from None
        try:
            self._entries = self._index_entries(self._zip.entries)
            self.files = {
                name: self._source_file(name, e) for name, e in self._entries.items() if name not in _METADATA
            }
        except BaseException:
            self._zip.close()
            raise

    @staticmethod
    def _index_entries(entries: list[ZipEntry]) -> dict[str, ZipEntry]:
        out: dict[str, ZipEntry] = {}
        for e in entries:
            name = _COMPAT_NAMES.get(e.name, e.name)
            if e.is_dir:
                validate_carton_path(name.rstrip("/"))
                continue
            validate_carton_path(name)
            if name in out:
                raise InvalidCarton(name, "appears more than once in the zip")
            out[name] = e
        return out

    def _source_file(self, name: str, e: ZipEntry) -> SourceFile:
        if e.is_symlink:
            if e.uncompressed_size > SYMLINK_TARGET_LIMIT:
                raise InvalidCarton(name, "symlink target is too long")
            with self._zip.open(e) as s:
                raw = s.read(SYMLINK_TARGET_LIMIT + 1)
            try:
                target = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidCarton(name, "symlink target is not UTF-8") from None
            return SourceFile(name, "symlink", None, target)
        return SourceFile(name, "file", e.uncompressed_size)

    def read_metadata(self, name: str) -> bytes | None:
        from .view import METADATA_LIMITS

        e = self._entries.get(name)
        if e is None:
            return None
        limit = METADATA_LIMITS[name]
        if e.uncompressed_size > limit:
            raise InvalidCarton(name, f"is {e.uncompressed_size} bytes, more than the {limit} allowed")
        with self._zip.open(e) as s:
            return s.read()

    def open(self, path: str) -> BinaryIO:
        return self._zip.open(self._entries[path])  # type: ignore[return-value]

    def raw_span(self, path: str) -> tuple[int, int] | None:
        """(offset, length) of a Stored entry's bytes in the zip, for a fast
        copy that skips the decoder; None for compressed entries."""
        e = self._entries[path]
        return self._zip.data_span(e) if e.method == 0 else None

    @property
    def zip_path(self) -> Path:
        return Path(self.label)

    def close(self) -> None:
        self._zip.close()
