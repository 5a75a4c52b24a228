"""The C library of this process, for the few calls Python does not wrap
(fallocate with flags, sync_file_range, mallopt, prctl).

dlopen(NULL), not ctypes.util.find_library("c"): find_library runs
``ldconfig -p`` (and gcc, failing that) in a subprocess each time it is
called. Called by the first writes of eight concurrent downloads, that was
eight forks of a multi-threaded process and 0.8 s before the first byte was
written (bench_fetch phase 2, a 3.4 s pull). The process's own symbol scope
already holds libc's functions, on glibc, musl and macOS alike.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctypes


@lru_cache(maxsize=1)
def libc() -> ctypes.CDLL | None:
    """This process's C library (errno kept for ctypes.get_errno), or None
    where ctypes cannot load it."""
    # ctypes imported here: `path` and `ls` open the store and need none of it.
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
