"""CartonView over a local .carton (zip) file, and the entry rules every
zip-backed view shares (local or remote)."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Callable

from cartonstore.errors import InvalidCarton, NotFound
from cartonstore.format.paths import validate_carton_path
from cartonstore.zipfmt import ZipEntry, ZipLimits, ZipReader
from cartonstore.zipfmt.end_records import ARCHIVE

from .view import METADATA_LIMITS, SYMLINK_TARGET_LIMIT, SourceFile

# Carton's shrink tool wrote these two as absolute names; they are the only
# leading-slash names accepted, and only for these files.
_COMPAT_NAMES = {"/MANIFEST": "MANIFEST", "/LINKS": "LINKS"}
METADATA_NAMES = ("MANIFEST", "LINKS")


def index_zip_entries(entries: list[ZipEntry]) -> dict[str, ZipEntry]:
    """Carton path -> entry, with every name validated and no duplicates."""
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


def source_file(name: str, e: ZipEntry, read_small: Callable[[ZipEntry, int], bytes]) -> SourceFile:
    """The SourceFile for an entry; a symlink's target is read through read_small."""
    if not e.is_symlink:
        return SourceFile(name, "file", e.uncompressed_size)
    if e.uncompressed_size > SYMLINK_TARGET_LIMIT:
        raise InvalidCarton(name, "symlink target is too long")
    try:
        target = read_small(e, SYMLINK_TARGET_LIMIT).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidCarton(name, "symlink target is not UTF-8") from None
    return SourceFile(name, "symlink", None, target)


def check_metadata_size(name: str, e: ZipEntry) -> None:
    limit = METADATA_LIMITS[name]
    if e.uncompressed_size > limit:
        raise InvalidCarton(name, f"is {e.uncompressed_size} bytes, more than the {limit} allowed")


class ZipCartonView:
    def __init__(self, path: Path, limits: ZipLimits | None = None) -> None:
        self.label = str(path)
        try:
            self._zip = ZipReader(path, limits or ZipLimits())
        except FileNotFoundError:
            raise NotFound(f"no such file: {path}", subject=str(path)) from None
        except IsADirectoryError:
            raise NotFound(f"{path} is a directory, not a .carton file", subject=str(path)) from None
        except InvalidCarton as e:  # the zip as a whole: name the file the user gave
            if e.file != ARCHIVE:
                raise
            raise InvalidCarton(str(path), e.problem, field=e.field) from None
        try:
            self._entries = index_zip_entries(self._zip.entries)
            self.files = {name: source_file(name, e, self._read_small)
                          for name, e in self._entries.items() if name not in METADATA_NAMES}
        except BaseException:
            self._zip.close()
            raise

    def _read_small(self, e: ZipEntry, limit: int) -> bytes:
        with self._zip.open(e) as s:
            return s.read(limit + 1)

    def read_metadata(self, name: str) -> bytes | None:
        e = self._entries.get(name)
        if e is None:
            return None
        check_metadata_size(name, e)
        with self._zip.open(e) as s:
            return s.read()

    def open(self, path: str) -> BinaryIO:
        return self._zip.open(self._entries[path])  # type: ignore[return-value]

    def entry(self, path: str) -> ZipEntry:
        """The zip entry that holds a carton path (to record it as a source)."""
        return self._entries[path]

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
