"""``read_at(offset, size)``: how the header parsers (GGUF, ONNX) read a
file they are given, so that a caller hands them an open file, bytes in
memory or a range reader alike, and a parser reads only what it needs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import BinaryIO

ReadAt = Callable[[int, int], bytes]
"""The file's ``size`` bytes at ``offset`` (fewer at its end)."""


def read_at_file(f: BinaryIO) -> ReadAt:
    """Reads of an open file by position (pread: no shared offset to move)."""
    fd = f.fileno()
    return lambda offset, size: os.pread(fd, size, offset)


def read_at_stream(f: BinaryIO) -> ReadAt:
    """Reads of a seekable stream that may have no descriptor (a member of
    a zip file); one reader at a time."""
    def read_at(offset: int, size: int) -> bytes:
        f.seek(offset)
        return f.read(size)
    return read_at


def read_at_bytes(data: bytes) -> ReadAt:
    return lambda offset, size: data[offset:offset + size]
