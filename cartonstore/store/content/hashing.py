"""Hashing a file's bytes in 1 MiB steps: the one place blobs.py and
prefix_hash.py both read a file through sha256."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from cartonstore.errors import Unavailable

if TYPE_CHECKING:
    import hashlib

CHUNK = 1 << 20


def sha256() -> hashlib._Hash:  # hashlib imported on first use: opening a store to read it (`path`) hashes nothing
    import hashlib

    return hashlib.sha256()


def git_blob(size: int) -> hashlib._Hash:
    """The hash whose digest is git's object id of a ``size``-byte file
    (sha1 over "blob SIZE\\0" and the bytes): how the Hugging Face Hub and
    its cache name the files kept in git."""
    import hashlib

    return hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)


def hash_span(fd: int, start: int, end: int, h: hashlib._Hash, *, name: str, buf: bytearray | None = None) -> None:
    """Feed bytes [start, end) of fd to the hash ``h``, read in 1 MiB steps
    (into ``buf`` when given). Raises Unavailable if the file ends first."""
    view = memoryview(buf if buf is not None else bytearray(CHUNK))
    while start < end:
        n = os.preadv(fd, [view[:min(len(view), end - start)]], start)
        if n <= 0:
            raise Unavailable(f"short read hashing {name} at {start}", subject=name)
        h.update(view[:n])
        start += n


def hash_file(path: Path) -> str:
    h = sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()
