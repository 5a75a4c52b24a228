"""A bytearray whose pages are not written before its bytes arrive.

bytearray(n) zero-fills its n bytes: for a 256 MiB request body, 65,536
page faults (~60 ms of the event loop) and 256 MiB resident before the first
byte of the body came, so a client that claims a big Content-Length and
sends nothing costs all of it. A buffer that is received into in order and
read only once it is full need not be zeroed first: an empty bytearray
resized in C keeps its memory as malloc gave it, which past malloc's mmap
threshold (malloc_tuning.py) is fresh pages that become resident only as
they are written, and go back to the kernel whole when the buffer is freed.
"""

from __future__ import annotations

import ctypes

UNFILLED_FROM = 1 << 20   # below this, bytearray(size): zeroing costs less than the call

_resize = ctypes.pythonapi.PyByteArray_Resize
_resize.argtypes = [ctypes.py_object, ctypes.c_ssize_t]
_resize.restype = ctypes.c_int


def unfilled_bytearray(size: int) -> bytearray:
    """``size`` bytes whose content is undefined until written: the caller
    fills all of it before anything reads it. MemoryError as bytearray()."""
    if size < UNFILLED_FROM:
        return bytearray(size)
    buffer = bytearray()
    _resize(buffer, size)   # a failure raises the MemoryError it set (ctypes.pythonapi checks)
    return buffer
