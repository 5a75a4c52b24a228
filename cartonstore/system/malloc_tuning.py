"""Keep freed tensor-sized buffers mapped, so the next request reuses them.

glibc hands every allocation over its mmap threshold (128 KiB, rising
adaptively to at most 32 MiB) to the kernel on free. A server that receives
a 4 MiB tensor per request then page-faults in ~1,000 fresh pages for every
request body, every answer and every array: measured on a 2-core VM
(tests/bench/bench_infer.py), that was 880 faults and ~5 ms of CPU per
4 MiB request in the daemon and 2,700 faults in a runner, half of all the
time either spent. With buffers up to 32 MiB served from the heap and up
to 64 MiB of free heap kept, throughput doubled in both.

The cost is bounded: a process keeps at most TRIM_THRESHOLD of freed memory
per malloc arena (top of heap) instead of returning it at once. A user who
sets glibc's own MALLOC_* variables or GLIBC_TUNABLES keeps their choice.
"""

from __future__ import annotations

import ctypes
import logging
import os

from .libc import libc

log = logging.getLogger("cartonstore")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20   # glibc's maximum on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 64 << 20
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_big_buffers() -> bool:
    """Tune glibc malloc for this process; False where it is not glibc, or
    where the environment already says how malloc should behave."""
    if any(name in os.environ for name in _USER_SETTINGS):
        return False
    mallopt = getattr(libc(), "mallopt", None)
    if mallopt is None:   # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # Trim first: setting the mmap threshold also stops glibc's adaptive rule.
    done = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    if not done:
        log.debug("mallopt refused the buffer settings; malloc keeps its defaults")
    return done
