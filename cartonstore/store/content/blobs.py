"""The blob area: immutable files named by the sha256 of their bytes.

Writes follow containerd's ingest/commit: bytes go to a file in tmp/ while
being hashed, the file is fsynced and made read-only (*staged*), and only a
commit renames it to blobs/sha256/ab/<digest>. So a path under blobs/ exists
only if its bytes hash to its name (invariant 1), whatever crashes when.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from cartonstore.errors import IntegrityError, Unavailable
from cartonstore.store.root.layout import StoreLayout
from cartonstore.store.root.owner import tmp_name

from .filespace import WRITEBACK_STEP, clone_range, reserve, start_writeback
from .hashing import CHUNK, hash_file, hash_span, sha256

if TYPE_CHECKING:
    from .prefix_hash import PrefixHasher


BLOB_MODE = 0o444


@dataclass(frozen=True)
class StagedBlob:
    """Verified, fsynced bytes in tmp/ waiting to be committed or discarded."""

    digest: str
    size: int
    tmp_path: Path
    origin: str | None = None
    """The kind of source its bytes were fetched from (the store's figures,
    store/metadata/source_bytes.py); None: read from the source being added,
    or made here."""

    def discard(self) -> None:
        _unlink_quietly(self.tmp_path)


class BlobWriter:
    """Streams bytes into tmp/, hashing them as they pass.

    stage() fsyncs, checks the digest and size the caller expects (if any)
    and returns a StagedBlob; on any error the temporary file is removed.
    Always use as a context manager: leaving without stage() discards.
    """

    def __init__(self, layout: StoreLayout, *, label: str = "blob") -> None:
        self.tmp_path = Path(f"{tmp_name(layout.tmp_dir, 'ingest')}-{label}")
        try:
            self._fd = os.open(self.tmp_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise _translate_write_error(e, self.tmp_path) from e
        self._hash = sha256()
        self.size = 0
        self._written_back = 0   # writeback started for [0, _written_back)
        self._parts: PrefixHasher | None = None
        self._staged = False
        self.rewrites = 0   # times the file was started again (reset, parts): a reader following it must know
        # called in the writing thread once more bytes landed (or the file was started again): a reader
        # following the download is woken by it rather than looking again and again
        self.on_landed: Callable[[], None] | None = None

    def reserve(self, size: int) -> None:
        """The blob will be about ``size`` bytes: allocate its disk space now
        (filespace.py: cheaper writes, and a full disk fails before the
        download, not after). Does not change what the file holds."""
        try:
            reserve(self._fd, size)
        except OSError as e:
            raise _translate_write_error(e, self.tmp_path) from e

    def write(self, data: bytes | memoryview) -> None:
        self._hash.update(data)
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except OSError as e:
                raise _translate_write_error(e, self.tmp_path) from e
            view = view[n:]
        self.size += len(data)
        if self.size - self._written_back >= WRITEBACK_STEP:
            start_writeback(self._fd, self._written_back, self.size - self._written_back)
            self._written_back = self.size
        self._landed()

    def copy_range(self, src: BinaryIO, offset: int, length: int) -> None:
        """Append ``length`` bytes of the file ``src`` from ``offset``. Where
        the filesystem shares blocks (XFS, btrfs) and the range is
        block-aligned in both files, its whole blocks are reflinked
        (filespace.clone_range: no copy, no space) and then hashed as they
        now are in this file, so what is verified is what the file holds; the
        rest, and everything elsewhere, is copied through the hash as
        copy_from does (on ext4 that is faster than copy_file_range plus a
        read back). Stops early at the source's end (the caller checks the
        size)."""
        block = os.fstatvfs(self._fd).f_frsize or 4096   # the block, not st_blksize (the preferred I/O size)
        shared = length - length % block if offset % block == 0 and self.size % block == 0 else 0
        try:
            cloned = bool(shared) and clone_range(src.fileno(), offset, shared, self._fd, self.size)
        except OSError as e:  # ENOSPC, EDQUOT for the extent maps: as any failed write
            raise _translate_write_error(e, self.tmp_path) from e
        if cloned:
            hash_span(self._fd, self.size, self.size + shared, self._hash, name=str(self.tmp_path))
            self.size += shared
            self._written_back = self.size  # nothing to write back: no new data
            os.lseek(self._fd, self.size, os.SEEK_SET)  # the ioctl moved no file position: write() goes on here
            self._landed()
            offset, length = offset + shared, length - shared
        if length:
            src.seek(offset)
            self.copy_from(src, limit=length)

    def _landed(self) -> None:
        if self.on_landed is not None:
            self.on_landed()

    def landed(self) -> int:
        """Bytes [0, landed) of the file are written: what a reader following
        the download (in another thread or fd) may read now."""
        parts = self._parts
        return parts.prefix() if parts is not None else self.size

    @property
    def digest(self) -> str:
        """sha256 of the bytes written so far (in order)."""
        return self._hash.hexdigest()

    def hash_parts(self, size: int) -> PrefixHasher:
        """Before write_at(): the file will be ``size`` bytes written as parts.
        The caller runs the returned hasher's run() in a worker thread while
        the parts are written, then calls parts_hashed()."""
        self.reserve(size)
        self.rewrites += 1
        from .prefix_hash import PrefixHasher  # hashlib and threads only for a parted fetch

        self._parts = PrefixHasher(self._fd, size, name=str(self.tmp_path))
        self._landed()   # written again from the start: a reader following the file must look
        return self._parts

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        """Positional write of a part (after hash_parts); thread-safe."""
        view = memoryview(data)
        length = len(view)
        at = offset
        while view:
            try:
                n = os.pwrite(self._fd, view, at)
            except OSError as e:
                raise _translate_write_error(e, self.tmp_path) from e
            view = view[n:]
            at += n
        if self._parts is not None:
            self._parts.landed(offset, length)
        self._landed()

    def parts_hashed(self) -> None:
        """After the hasher's run() returned: the file is its ``size`` bytes,
        hashed in order, as if they had been written with write()."""
        hasher = self._parts
        assert hasher is not None and hasher.hashed == hasher.size, "parts_hashed() before the hasher finished"
        os.ftruncate(self._fd, hasher.size)
        self._hash = hasher.hash
        self.size = self._written_back = hasher.size
        self._parts = None
        os.lseek(self._fd, hasher.size, os.SEEK_SET)

    def reset(self) -> None:
        """Start over (a download that cannot resume): empty file, fresh hash."""
        self.rewrites += 1
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        self._hash = sha256()
        self.size = self._written_back = 0
        self._parts = None
        self._landed()

    def copy_from(self, src: BinaryIO, limit: int | None = None) -> None:
        """Copy src (to EOF, or ``limit`` bytes) through the hash into the file."""
        if limit is not None:
            self.reserve(self.size + limit)  # reserve() counts from the file's start
        buf = bytearray(CHUNK)
        remaining = limit
        while remaining is None or remaining > 0:
            want = CHUNK if remaining is None else min(CHUNK, remaining)
            n = src.readinto(memoryview(buf)[:want]) if hasattr(src, "readinto") else None
            if n is None:
                chunk = src.read(want)
                n = len(chunk)
                buf[:n] = chunk
            if not n:
                break
            self.write(memoryview(buf)[:n])
            if remaining is not None:
                remaining -= n

    def stage(self, *, expected_digest: str | None = None, expected_size: int | None = None) -> StagedBlob:
        digest = self._hash.hexdigest()
        try:
            if expected_size is not None and self.size != expected_size:
                raise IntegrityError(
                    f"expected {expected_size} bytes for blob {expected_digest or digest} but got {self.size}",
                    subject=expected_digest or digest,
                )
            if expected_digest is not None and digest != expected_digest:
                raise IntegrityError(
                    f"bytes hash to sha256 {digest}, expected {expected_digest}",
                    subject=expected_digest,
                )
            try:
                os.fsync(self._fd)  # durable before the rename makes it visible
                os.fchmod(self._fd, BLOB_MODE)
            except OSError as e:
                raise _translate_write_error(e, self.tmp_path) from e
        except BaseException:
            self.close()
            raise
        self._staged = True
        os.close(self._fd)
        self._fd = -1
        return StagedBlob(digest, self.size, self.tmp_path)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if not self._staged:
            _unlink_quietly(self.tmp_path)

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlobStore:
    """Read, commit and delete verified blobs. Knows nothing of the index."""

    def __init__(self, layout: StoreLayout) -> None:
        self.layout = layout

    def path(self, digest: str) -> Path:
        return self.layout.blob_path(digest)

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def size(self, digest: str) -> int:
        return self.path(digest).stat().st_size

    def size_if_present(self, digest: str) -> int | None:
        try:
            st = self.path(digest).stat()
        except FileNotFoundError:
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def writer(self, *, label: str = "blob") -> BlobWriter:
        return BlobWriter(self.layout, label=label)

    def commit(self, staged: StagedBlob) -> Path:
        """Rename a staged blob into place. A blob already present is a normal
        outcome: the staged copy is dropped and the existing one kept.
        The parent directory is not fsynced here; see sync_dirs()."""
        dest = self.path(staged.digest)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _translate_write_error(e, dest.parent) from e
        if dest.exists():
            staged.discard()
            return dest
        os.rename(staged.tmp_path, dest)
        return dest

    def sync_dirs(self, digests: set[str]) -> None:
        """fsync the fan-out dirs of fresh blobs so their renames survive power loss
        before the index records them (one fsync per directory, not per blob)."""
        for d in sorted({self.path(x).parent for x in digests}):
            fsync_dir(d)

    def delete(self, digest: str) -> int:
        """Unlink a blob; returns the bytes freed (0 if it was already gone)."""
        p = self.path(digest)
        try:
            size = p.stat().st_size
            p.unlink()
            return size
        except FileNotFoundError:
            return 0

    def iter_digests(self) -> Iterator[str]:
        if not self.layout.blobs_dir.is_dir():
            return
        for fan in sorted(os.scandir(self.layout.blobs_dir), key=lambda e: e.name):
            if fan.is_dir(follow_symlinks=False):
                for entry in sorted(os.scandir(fan.path), key=lambda e: e.name):
                    yield entry.name

    def rehash(self, digest: str) -> str:
        """sha256 of the stored bytes (what verify compares with the name)."""
        return hash_file(self.path(digest))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _translate_write_error(e: OSError, path: Path) -> Exception:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return Unavailable(f"no space left on device while writing {path}", subject=str(path))
    return Unavailable(f"cannot write {path}: {e.strerror}", subject=str(path))
