"""Read a zip file on local disk: list its entries and stream their content.

Opening a ``ZipReader`` validates the whole archive layout up front (end
records, central directory, every local header, limits, overlap), so a
caller that got a reader can trust the entry list. The content of each entry
is checked as it streams: never more than its declared size, and at the end
exactly its declared size and CRC-32.

Reads use ``os.pread`` when the file has a descriptor, so several entry
streams can be read at once, from several threads, without sharing a file
position.
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO

from cartonstore.errors import InvalidCarton

from .central import (
    LOCAL_HEADER_FIXED,
    ZipEntry,
    check_entry_limits,
    check_no_overlap,
    local_header_length,
    parse_central_directory,
)
from .decode import Decoder
from .end_records import (
    ARCHIVE,
    TAIL_READ_SIZE,
    CentralDirectoryLocation,
    check_directory_limits,
    locate_central_directory,
)
from .entry_decoder import EntryDecoder
from .limits import ZipLimits

READ_CHUNK = 1 << 20


class _Source:
    """Positioned reads from a file, by pread when possible."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        try:
            self._fd: int | None = file.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            self._fd = None
        self.size = file.seek(0, os.SEEK_END)

    def read(self, offset: int, length: int) -> bytes:
        if self._fd is not None:
            return os.pread(self._fd, length, offset)
        self._file.seek(offset)
        return self._file.read(length)

    def read_exact(self, offset: int, length: int, file: str, what: str) -> bytes:
        data = self.read(offset, length) if offset + length <= self.size else b""
        if len(data) != length:
            raise InvalidCarton(
                file, f"file is truncated: {what} at offset {offset} runs past its end"
            )
        return data


class ZipReader:
    """A validated zip archive; use as a context manager.

    ``source`` is a path (opened and closed by the reader) or a seekable
    binary file object (left open). Raises ``InvalidCarton`` if the archive
    is malformed, hostile or over ``limits``; OSError from the file itself
    (missing, unreadable) propagates unchanged.
    """

    def __init__(
        self, source: str | os.PathLike[str] | BinaryIO, limits: ZipLimits | None = None
    ) -> None:
        self.limits = limits or ZipLimits()
        self._file: BinaryIO
        if isinstance(source, (str, os.PathLike)):
            self._file, self._owned = open(source, "rb"), True  # noqa: SIM115 - owned: closed by close()
        else:
            self._file, self._owned = source, False
        try:
            self._source = _Source(self._file)
            location, self.entries = self._read_entries()
            self._spans = self._read_data_spans(location.offset)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ZipReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file if the reader opened it. Idempotent."""
        if self._owned:
            self._file.close()

    def data_span(self, entry: ZipEntry) -> tuple[int, int]:
        """(absolute offset, length) of ``entry``'s compressed data.

        Raises ``KeyError`` if ``entry`` is not in this archive.
        """
        return self._spans[entry]

    def open(self, entry: ZipEntry) -> EntryStream:
        """A stream of ``entry``'s decoded content; see ``EntryStream``.

        Raises ``KeyError`` if ``entry`` is not in this archive.
        """
        offset, length = self.data_span(entry)
        return EntryStream(self._source, entry, offset, length)

    def _read_entries(self) -> tuple[CentralDirectoryLocation, list[ZipEntry]]:
        tail_offset = max(0, self._source.size - TAIL_READ_SIZE)
        tail = self._source.read_exact(
            tail_offset, self._source.size - tail_offset, ARCHIVE, "end of file"
        )
        location = locate_central_directory(tail, tail_offset)
        check_directory_limits(location, self.limits)
        directory = self._read_directory(location, tail, tail_offset)
        entries = parse_central_directory(directory, location, self.limits)
        for entry in entries:
            check_entry_limits(entry, self.limits)
        return location, entries

    def _read_directory(
        self, location: CentralDirectoryLocation, tail: bytes, tail_offset: int
    ) -> bytes:
        # Small archives: the central directory is already in the tail.
        if location.offset >= tail_offset:
            start = location.offset - tail_offset
            return tail[start : start + location.size]
        return self._source.read_exact(location.offset, location.size, ARCHIVE, "central directory")

    def _read_data_spans(self, cd_offset: int) -> dict[ZipEntry, tuple[int, int]]:
        spans: dict[ZipEntry, tuple[int, int]] = {}
        extents = []
        for entry in self.entries:
            offset = entry.local_header_offset
            # One read per entry: the local extra field's length is in the
            # fixed part, and we never need its content.
            header = self._source.read_exact(
                offset, LOCAL_HEADER_FIXED + len(entry.raw_name), entry.name, "local header"
            )
            data_offset = offset + local_header_length(header, entry)
            spans[entry] = (data_offset, entry.compressed_size)
            extents.append((entry, offset, data_offset + entry.compressed_size))
        check_no_overlap(extents, cd_offset)
        return spans


class EntryStream(io.RawIOBase):
    """The decoded content of one entry, read in chunks.

    ``read(n)`` returns ``n`` bytes, fewer at the end, ``b""`` after it.
    Raises ``InvalidCarton(entry.name, ...)`` as soon as the content exceeds
    the declared size, and at the end if its size or CRC-32 differ from the
    central directory; also if the compressed data is corrupt or truncated.
    Memory stays bounded by ``READ_CHUNK`` and ``n``.
    """

    def __init__(self, source: _Source, entry: ZipEntry, offset: int, length: int) -> None:
        super().__init__()
        self.entry = entry
        self._source = source
        self._checker = EntryDecoder(entry)
        self._decoder: Decoder = self._checker.decoder
        self._offset = offset
        self._compressed_left = length
        self._decoded = 0
        self._crc = 0
        self._at_end = False

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` decoded bytes; fewer only at the end, b"" after it.

        Like a buffered file, so ``read(n)`` of a small entry returns all of
        it. Without ``size`` the whole entry is read into memory.
        """
        if self.closed:
            raise ValueError("read from a closed entry stream")
        if size is None or size < 0:
            return self.readall()
        parts = []
        while size and not self._at_end:
            part = self._read_some(size)
            parts.append(part)
            size -= len(part)
        return b"".join(parts)

    def readall(self) -> bytes:
        chunks = []
        while chunk := self.read(READ_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]  # RawIOBase takes any writable buffer; this one takes these
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def _read_some(self, size: int) -> bytes:
        """At least one and at most ``size`` decoded bytes, or b"" at the end."""
        while True:
            # One byte past the declared size is enough to detect a lie.
            limit = min(size, self.entry.uncompressed_size - self._decoded + 1)
            out = self._decode_more(limit)
            if out is None:
                self._finish()
                return b""
            if out:
                self._account(out)
                return out

    def _decode_more(self, limit: int) -> bytes | None:
        """Some decoded bytes (maybe none yet), or None at the end of the input."""
        if not self._decoder.needs_input:
            return self._decoder.decode(b"", limit)
        chunk = self._next_compressed()
        if not chunk:
            return None
        return self._decoder.decode(chunk, limit)

    def _next_compressed(self) -> bytes:
        length = min(READ_CHUNK, self._compressed_left)
        if not length:
            return b""
        chunk = self._source.read_exact(self._offset, length, self.entry.name, "compressed data")
        self._offset += length
        self._compressed_left -= length
        return chunk

    def _account(self, out: bytes) -> None:
        self._checker.account(out)
        self._decoded = self._checker.decoded

    def _finish(self) -> None:
        self._checker.finish()
        self._at_end = True
