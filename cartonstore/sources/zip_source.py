"""CartonView over a local .carton (zip) file, and the entry rules every
zip-backed view shares (local or remote). The file is opened once, with
``rights`` (a caller's own, for a file a caller named to a daemon running as
root: system/callers.py); everything after reads that descriptor, never the
path again."""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from cartonstore.errors import InvalidCarton, NotFound
from cartonstore.format.paths import validate_carton_path
from cartonstore.system.callers import OWN_RIGHTS, OwnRights
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


def _open_file(path: Path) -> BinaryIO:
    """The file at path, opened for reading; O_NONBLOCK so that a fifo named
    instead fails here rather than hanging the open."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise NotFound(f"{path} is a directory, not a .carton file", subject=str(path))
        if not stat.S_ISREG(mode):
            raise InvalidCarton(str(path), "is not a regular file (device, socket or fifo)")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class ZipCartonView:
    def __init__(self, path: Path, limits: ZipLimits | None = None, *, rights: OwnRights = OWN_RIGHTS) -> None:
        self.label = str(path)
        try:
            self._file = rights.run(_open_file, path)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"no such file: {path}", subject=str(path)) from None
        try:
            self._zip = ZipReader(self._file, limits or ZipLimits())
        except InvalidCarton as e:  # the zip as a whole: name the file the user gave
            self._file.close()
            if e.file != ARCHIVE:
                raise
            raise InvalidCarton(str(path), e.problem, field=e.field) from None
        except BaseException:
            self._file.close()
            raise
        try:
            self._entries = index_zip_entries(self._zip.entries)
            self.files = {name: source_file(name, e, self._read_small)
                          for name, e in self._entries.items() if name not in METADATA_NAMES}
        except BaseException:
            self._file.close()
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
        return self._zip.open(self._entries[path])  # type: ignore[return-value]  # an EntryStream reads as a binary file does

    def entry(self, path: str) -> ZipEntry:
        """The zip entry that holds a carton path (to record it as a source)."""
        return self._entries[path]

    def raw_span(self, path: str) -> tuple[int, int] | None:
        """(offset, length) of a Stored entry's bytes in the zip, for a fast
        copy that skips the decoder; None for compressed entries."""
        e = self._entries[path]
        return self._zip.data_span(e) if e.method == 0 else None

    def raw_file(self) -> BinaryIO:
        """The zip file as this view opened it, with a position of its own
        (spans are copied by several threads at once)."""
        return _PositionedFile(self._file.fileno())  # type: ignore[return-value]  # a RawIOBase reads as a binary file does

    @property
    def zip_path(self) -> Path:
        return Path(self.label)

    def close(self) -> None:
        self._file.close()


class _PositionedFile(io.RawIOBase):
    """Reads of a shared descriptor by pread, at a position of its own; the
    descriptor stays its owner's (closing this does not close it)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._pos = 0

    def fileno(self) -> int:
        return self._fd

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: os.fstat(self._fd).st_size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]  # RawIOBase takes any writable buffer; this one takes these
        n = os.preadv(self._fd, [buffer], self._pos)
        self._pos += n
        return n
