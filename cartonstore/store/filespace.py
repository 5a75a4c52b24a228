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

FALLOC_FL_KEEP_SIZE = 0x01      # reserve blocks past EOF; st_size stays what was written
SYNC_FILE_RANGE_WRITE = 0x02    # start writeback of dirty pages in the range, do not wait

WRITEBACK_STEP = 16 << 20
"""Bytes written between two writeback starts: big enough that the call is
rare, small enough that the fsync at the end has little left to do."""


@lru_cache(maxsize=1)
def _libc():  # noqa: ANN202 - a ctypes.CDLL, or None
    # ctypes imported here: `path` and `ls` open the store and must not pay
    # for ctypes.util (it imports subprocess, tempfile and shutil).
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
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
_CANNOT_CLONE = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS,
                           errno.EPERM, errno.ETXTBSY})


def clone_range(src_fd: int, src_offset: int, length: int, dst_fd: int, dst_offset: int) -> bool:
    """Make [dst_offset, +length) of dst_fd share the disk blocks of
    [src_offset, +length) of src_fd (a reflink: nothing is copied, no space
    is used). False where the filesystem cannot: not one that shares blocks
    (ext4, tmpfs), two filesystems, offsets or length not block-aligned.
    Raises OSError for other failures (ENOSPC, EIO)."""
    try:
        fcntl.ioctl(dst_fd, FICLONERANGE, _CLONE_RANGE.pack(src_fd, src_offset, length, dst_offset))
    except OSError as e:
        if e.errno in _CANNOT_CLONE:
            return False
        raise
    return True
