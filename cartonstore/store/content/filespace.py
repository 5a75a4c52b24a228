"""Kernel help for writing a large blob cheaply: reserve its space before
the bytes come, start writing it to disk while it is received, and, for
bytes already on the same filesystem, share them instead of copying.

Measured on ext4 (tests/bench/bench_fetch.py's machine): writing 1 GiB into
a fresh file with 4 MiB pwrites costs 2.0-2.2 CPU-seconds when the dirty
pages pile up unallocated (delayed allocation, then dirty throttling), and
0.25-0.45 with either hint. Reserving the space also makes a disk that is
too small fail at once, not after gigabytes. Writeback started early means
the fsync that makes a blob durable waits for the last few MiB only.

The first two are hints: where the libc or the filesystem lacks them
(macOS, tmpfs for writeback, some network filesystems) they do nothing, and
nothing else changes; neither changes the file's size or contents. Sharing
(clone_range: a reflink, FICLONERANGE) is done by XFS, btrfs and bcachefs,
for block-aligned ranges; elsewhere it reports False and the caller copies.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from functools import lru_cache
from typing import TYPE_CHECKING

from cartonstore.system.libc import libc as c_library

if TYPE_CHECKING:
    import ctypes

FALLOC_FL_KEEP_SIZE = 0x01      # reserve blocks past EOF; st_size stays what was written
SYNC_FILE_RANGE_WRITE = 0x02    # start writeback of dirty pages in the range, do not wait

WRITEBACK_STEP = 16 << 20
"""Bytes written between two writeback starts: big enough that the call is
rare, small enough that the fsync at the end has little left to do."""


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    import ctypes

    libc = c_library()
    if libc is None:
        return None
    for name, args in (("fallocate", [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
                       ("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint])):
        fn = getattr(libc, name, None)
        if fn is not None:
            fn.argtypes = args
            fn.restype = ctypes.c_int
    return libc


def reserve(fd: int, size: int) -> None:
    """Allocate ``size`` bytes of disk for fd without changing its size.
    Raises OSError(ENOSPC/EDQUOT) when the disk cannot hold them; any other
    failure (not supported here) is ignored: the writes allocate as usual."""
    libc = _libc()
    fn = getattr(libc, "fallocate", None) if libc is not None else None
    if fn is None or size <= 0:
        return
    if fn(fd, FALLOC_FL_KEEP_SIZE, 0, size) != 0:
        import ctypes

        err = ctypes.get_errno()
        if err in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(err, os.strerror(err))


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing [offset, offset+length) of fd to disk,
    without waiting. Durability still comes only from fsync."""
    libc = _libc()
    fn = getattr(libc, "sync_file_range", None) if libc is not None else None
    if fn is not None and length > 0:
        fn(fd, offset, length, SYNC_FILE_RANGE_WRITE)  # a hint: its failure changes nothing


FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range), linux/fs.h
_CLONE_RANGE = struct.Struct("=qQQQ")  # src_fd, src_offset, src_length, dest_offset
# A refused clone leaves the range to be copied, whatever the reason the
# filesystem gives (EOPNOTSUPP, EXDEV, EINVAL; EAGAIN from OpenZFS 2.2 for
# blocks of the open transaction): only being out of space stops the write.
_OUT_OF_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def clone_range(src_fd: int, src_offset: int, length: int, dst_fd: int, dst_offset: int) -> bool:
    """Make [dst_offset, +length) of dst_fd share the disk blocks of
    [src_offset, +length) of src_fd (a reflink: nothing is copied, no space
    is used). False where the filesystem does not: not one that shares
    blocks (ext4, tmpfs), two filesystems, offsets or length not
    block-aligned, or any other refusal; the caller copies, and a copy meets
    real I/O errors itself. Raises OSError for ENOSPC and EDQUOT."""
    try:
        fcntl.ioctl(dst_fd, FICLONERANGE, _CLONE_RANGE.pack(src_fd, src_offset, length, dst_offset))
    except OSError as e:
        if e.errno in _OUT_OF_SPACE:
            raise
        return False
    return True


FS_IOC_FIEMAP = 0xC020660B  # _IOWR('f', 11, struct fiemap), linux/fs.h
_FIEMAP = struct.Struct("=QQIIII")         # fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count, -
_EXTENT = struct.Struct("=QQQ16xI12x")     # fe_logical, fe_physical, fe_length, -, fe_flags, -
_EXTENT_LAST, _EXTENT_SHARED = 0x1, 0x2000
_EXTENTS_PER_CALL = 256


def shared_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of the file whose disk blocks another file shares (a reflink,
    FIEMAP_EXTENT_SHARED): removing the file frees none of them. 0 where the
    filesystem does not say (no FIEMAP) or the file is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        shared, start = 0, 0
        while True:
            buf = bytearray(_FIEMAP.size + _EXTENTS_PER_CALL * _EXTENT.size)
            _FIEMAP.pack_into(buf, 0, start, (1 << 64) - 1 - start, 0, 0, _EXTENTS_PER_CALL, 0)
            try:
                fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
            except OSError as e:
                if e.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.ENOSYS):
                    return 0
                raise
            mapped = _FIEMAP.unpack_from(buf)[3]
            if mapped == 0:
                return shared
            for i in range(mapped):
                logical, _physical, length, flags = _EXTENT.unpack_from(buf, _FIEMAP.size + i * _EXTENT.size)
                if flags & _EXTENT_SHARED:
                    shared += length
                if flags & _EXTENT_LAST:
                    return shared
            start = logical + length
    finally:
        os.close(fd)
