"""Write zip archives, streaming each entry's content once.

Each entry's local header is written first with placeholder CRC and sizes,
then its data is compressed while streaming, then the header is patched by
seeking back. We do not use data descriptors (flag bit 3): patched headers
are readable by every zip tool, descriptors are not. The output is
reproducible: every entry has the same fixed timestamp and attributes depend
only on the arguments.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from typing import BinaryIO, Protocol

import zstandard

from .central import ZipEntry
from .layout import (
    CENTRAL_HEADER,
    CENTRAL_HEADER_SIG,
    DEFLATED,
    EOCD,
    EOCD_SIG,
    EXTRA_HEADER,
    FLAG_UTF8,
    LOCAL_HEADER,
    LOCAL_HEADER_SIG,
    MAX_U16,
    MAX_U32,
    S_IFLNK,
    S_IFREG,
    STORED,
    UNIX,
    ZIP64_EOCD,
    ZIP64_EOCD_BODY,
    ZIP64_EOCD_SIG,
    ZIP64_EXTRA_ID,
    ZIP64_LOCATOR,
    ZIP64_LOCATOR_SIG,
    ZSTD,
)

__all__ = ["COMPRESSION_METHODS", "DEFLATED", "STORED", "ZSTD", "ZipWriter"]

COMPRESSION_METHODS: dict[str, int] = {"stored": STORED, "deflate": DEFLATED, "zstd": ZSTD}
"""Compression method numbers by the names the CLI and config use."""

WRITE_CHUNK = 1 << 20

ALIGNMENT = 4096
ALIGN_MIN = 64 << 10
ALIGNMENT_EXTRA_ID = 0xD935
"""A stored entry of ALIGN_MIN bytes or more starts at a multiple of
ALIGNMENT in the archive, padded by an extra field in its local header (the
one Android's zipalign writes: this ID, the alignment, zeros). A store on
XFS or btrfs can then take the entry's bytes by reflink (FICLONERANGE:
store/filespace.clone_range), sharing disk blocks instead of copying them, and a reader
can mmap it. Readers skip extra fields they do not know; at most 4 KiB is
added per entry, and only to entries at least 16 times that size."""

# Entries at least this big (or of unknown size) get a zip64 local header.
# The margin below 4 GiB covers compressed output being slightly larger than
# its input (block headers on incompressible data: well under 0.1%).
ZIP64_LOCAL_THRESHOLD = 0xFF000000

_DOS_TIME = 0
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01, the earliest DOS date
_VERSION_MADE_BY = (UNIX << 8) | 63  # unix, APPNOTE 6.3
_SYMLINK_ATTR = (S_IFLNK | 0o777) << 16

# Offsets inside a local header that are patched once the data is written.
_LOCAL_CRC_AT = 14
_LOCAL_ZIP64_SIZES_AT = LOCAL_HEADER.size + EXTRA_HEADER.size  # after the name


class _Compressor(Protocol):
    def compress(self, data: bytes) -> bytes: ...
    def flush(self) -> bytes: ...


class _Copy:
    """The "compressor" of stored entries."""

    def compress(self, data: bytes) -> bytes:
        return data

    def flush(self) -> bytes:
        return b""


class ZipWriter:
    """Streams entries into a new zip archive; use as a context manager.

    ``target`` is a path (created or truncated) or a seekable, truncatable
    binary file object (left open). Leaving the ``with`` block normally
    writes the central directory; leaving it with an exception does not, so
    an interrupted archive is never a valid zip. Caller mistakes (bad name,
    unknown method, a source whose length differs from ``size``) raise
    ``ValueError``; I/O errors propagate as OSError.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | BinaryIO,
        *,
        zstd_level: int = 3,
        deflate_level: int = 6,
    ) -> None:
        self._file: BinaryIO
        if isinstance(target, (str, os.PathLike)):
            self._file, self._owned = open(target, "wb"), True  # noqa: SIM115 - owned: closed by close()
        else:
            self._file, self._owned = target, False
        self._zstd_level = zstd_level
        self._deflate_level = deflate_level
        self._written: list[tuple[ZipEntry, bool]] = []
        self._names: set[str] = set()
        self._closed = False

    def __enter__(self) -> ZipWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def add_file(
        self,
        name: str,
        src: BinaryIO,
        *,
        method: int,
        size: int | None = None,
        mode: int = 0o644,
    ) -> ZipEntry:
        """Add a regular file, reading ``src`` to its end in 1 MiB chunks.

        ``size``, when known, lets small entries skip zip64 fields; the
        source must then produce exactly that many bytes. If anything fails
        the archive is cut back to where it was, so the writer stays usable.
        Raises ``ValueError`` for a bad name, mode, method or size.
        """
        if not 0 <= mode <= 0o7777:
            raise ValueError(f"{name!r}: mode {mode:o} is not a permission mode")
        return self._add(name, src, method, size, (S_IFREG | mode) << 16)

    def add_bytes(self, name: str, data: bytes, *, method: int, mode: int = 0o644) -> ZipEntry:
        """Add a regular file holding ``data``; see ``add_file``."""
        return self.add_file(name, io.BytesIO(data), method=method, size=len(data), mode=mode)

    def add_symlink(self, name: str, target: str) -> ZipEntry:
        """Add a symbolic link to ``target`` (stored, as unix zip tools do)."""
        data = target.encode("utf-8")
        return self._add(name, io.BytesIO(data), STORED, len(data), _SYMLINK_ATTR)

    def close(self) -> None:
        """Write the central directory and end records. Idempotent.

        Closes the file if the writer opened it, even if writing fails.
        """
        if self._closed:
            return
        self._closed = True
        try:
            cd_offset = self._file.tell()
            directory = b"".join(_central_record(e, z) for e, z in self._written)
            self._file.write(directory)
            self._file.write(_end_records(cd_offset, len(directory), len(self._written)))
            self._file.flush()
        finally:
            if self._owned:
                self._file.close()

    def abort(self) -> None:
        """Stop without writing the central directory (the output is not a zip)."""
        self._closed = True
        if self._owned:
            self._file.close()

    def _add(
        self, name: str, src: BinaryIO, method: int, size: int | None, external_attr: int
    ) -> ZipEntry:
        if self._closed:
            raise ValueError("the zip writer is closed")
        raw_name = self._claim_name(name)
        compressor = self._compressor(method)
        zip64 = size is None or size >= ZIP64_LOCAL_THRESHOLD
        offset = self._file.tell()
        aligned = method == STORED and (size is None or size >= ALIGN_MIN)
        try:
            self._file.write(_local_header(raw_name, method, zip64, offset if aligned else None))
            crc, usize, csize = self._copy(src, compressor)
            if size is not None and usize != size:
                raise ValueError(f"{name!r}: size={size} but the source gave {usize} bytes")
            self._patch_local_header(offset, len(raw_name), zip64, (crc, csize, usize))
        except BaseException:
            self._file.seek(offset)
            self._file.truncate()
            self._names.discard(name)
            raise
        entry = ZipEntry(name, method, FLAG_UTF8, crc, csize, usize, offset, external_attr, UNIX)
        self._written.append((entry, zip64))
        return entry

    def _claim_name(self, name: str) -> bytes:
        raw_name = name.encode("utf-8")
        if not name or "\x00" in name or len(raw_name) > MAX_U16:
            raise ValueError(f"{name!r} is not a valid zip entry name")
        if name in self._names:
            raise ValueError(f"{name!r} is already in the archive")
        self._names.add(name)
        return raw_name

    def _compressor(self, method: int) -> _Compressor:
        if method == STORED:
            return _Copy()
        if method == DEFLATED:
            return zlib.compressobj(self._deflate_level, zlib.DEFLATED, -zlib.MAX_WBITS)
        if method == ZSTD:
            return zstandard.ZstdCompressor(level=self._zstd_level).compressobj()
        raise ValueError(f"unsupported compression method {method}")

    def _copy(self, src: BinaryIO, compressor: _Compressor) -> tuple[int, int, int]:
        crc = usize = csize = 0
        while chunk := src.read(WRITE_CHUNK):
            crc = zlib.crc32(chunk, crc)
            usize += len(chunk)
            csize += self._write(compressor.compress(chunk))
        csize += self._write(compressor.flush())
        return crc, usize, csize

    def _write(self, data: bytes) -> int:
        self._file.write(data)
        return len(data)

    def _patch_local_header(
        self, offset: int, name_length: int, zip64: bool, values: tuple[int, int, int]
    ) -> None:
        crc, csize, usize = values
        end = self._file.tell()
        self._file.seek(offset + _LOCAL_CRC_AT)
        if zip64:
            self._file.write(struct.pack("<I", crc))
            self._file.seek(offset + _LOCAL_ZIP64_SIZES_AT + name_length)
            self._file.write(struct.pack("<QQ", usize, csize))
        else:
            self._file.write(struct.pack("<III", crc, csize, usize))
        self._file.seek(end)


def _version_needed(method: int, zip64: bool) -> int:
    if method == ZSTD:
        return 63
    return 45 if zip64 else 20


def _local_header(raw_name: bytes, method: int, zip64: bool, align_at: int | None = None) -> bytes:
    # A zip64 local header must carry both sizes in its extra field (first:
    # _patch_local_header writes them there); the 32-bit fields then hold
    # the 0xFFFFFFFF marker.
    extra = EXTRA_HEADER.pack(ZIP64_EXTRA_ID, 16) + bytes(16) if zip64 else b""
    if align_at is not None:  # the header starts at align_at: pad so that the data starts on ALIGNMENT
        unpadded = align_at + LOCAL_HEADER.size + len(raw_name) + len(extra) + EXTRA_HEADER.size + 2
        padding = -unpadded % ALIGNMENT
        extra += EXTRA_HEADER.pack(ALIGNMENT_EXTRA_ID, 2 + padding) + struct.pack("<H", ALIGNMENT) + bytes(padding)
    sizes = MAX_U32 if zip64 else 0
    fixed = LOCAL_HEADER.pack(
        LOCAL_HEADER_SIG, _version_needed(method, zip64), FLAG_UTF8, method,
        _DOS_TIME, _DOS_DATE, 0, sizes, sizes, len(raw_name), len(extra),
    )  # fmt: skip
    return fixed + raw_name + extra


def _central_record(entry: ZipEntry, zip64_local: bool) -> bytes:
    # Only the values that overflow go in the zip64 extra, in APPNOTE order.
    wide = (entry.uncompressed_size, entry.compressed_size, entry.local_header_offset)
    body = b"".join(struct.pack("<Q", value) for value in wide if value >= MAX_U32)
    extra = EXTRA_HEADER.pack(ZIP64_EXTRA_ID, len(body)) + body if body else b""
    raw_name = entry.raw_name
    fixed = CENTRAL_HEADER.pack(
        CENTRAL_HEADER_SIG, _VERSION_MADE_BY, _version_needed(entry.method, zip64_local or bool(body)),
        entry.flags, entry.method, _DOS_TIME, _DOS_DATE, entry.crc32,
        min(entry.compressed_size, MAX_U32), min(entry.uncompressed_size, MAX_U32),
        len(raw_name), len(extra), 0, 0, 0, entry.external_attr,
        min(entry.local_header_offset, MAX_U32),
    )  # fmt: skip
    return fixed + raw_name + extra


def _end_records(cd_offset: int, cd_size: int, count: int) -> bytes:
    records = b""
    if count >= MAX_U16 or cd_offset >= MAX_U32 or cd_size >= MAX_U32:
        zip64_offset = cd_offset + cd_size
        records = ZIP64_EOCD.pack(
            ZIP64_EOCD_SIG, ZIP64_EOCD_BODY, _VERSION_MADE_BY, 45, 0, 0,
            count, count, cd_size, cd_offset,
        ) + ZIP64_LOCATOR.pack(ZIP64_LOCATOR_SIG, 0, zip64_offset, 1)  # fmt: skip
    short_count = min(count, MAX_U16)
    return records + EOCD.pack(
        EOCD_SIG, 0, 0, short_count, short_count,
        min(cd_size, MAX_U32), min(cd_offset, MAX_U32), 0,
    )  # fmt: skip
