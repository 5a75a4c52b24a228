"""POSIX shared memory objects named by the "key" of Triton's system
shared-memory extension, as shm_open(3) names them: one name after any
leading slashes ("/input0" and "input0" are the same object), never a path.
Both the daemon and the runners open them here.

Linux keeps them as files in /dev/shm; they are opened with O_NOFOLLOW,
so a symlink planted there does not lead anywhere else.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from cartonstore.errors import InvalidInput, Unavailable

SHM_DIR = Path("/dev/shm")
NAME_MAX = 255


def object_name(key: object) -> str:
    """The object's name (what shm_open looks up) for a region's key, or
    InvalidInput saying why the key is not one."""
    if type(key) is not str or not key:
        raise InvalidInput(f'"key" must be a non-empty string naming a POSIX shared memory object, not {key!r}',
                           subject="key")
    name = key.lstrip("/")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"key {key!r} is not valid UTF-8 text", subject="key") from None
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise InvalidInput(f"key {key!r} is not a POSIX shared memory object name: it must be one name "
                           f'such as "/input0", without other slashes (a path is not a key)', subject="key")
    if len(encoded) > NAME_MAX:
        raise InvalidInput(f"key {key[:40]!r}... is longer than {NAME_MAX} bytes", subject="key")
    return name


def open_object(key: str, *, writable: bool) -> tuple[int, os.stat_result]:
    """An fd on the object and its status; InvalidInput when it cannot be
    opened or is not a shared memory object."""
    name = object_name(key)
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(SHM_DIR / name, flags)
    except FileNotFoundError:
        raise InvalidInput(f"no shared memory object {key!r} exists (create it with shm_open before registering)",
                           subject="key") from None
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise Unavailable(f"cannot open shared memory object {key!r}: {e.strerror} (too many open files); "
                              f"unregister regions no longer used", subject="key") from None
        raise InvalidInput(f"cannot open shared memory object {key!r}: {e.strerror}"
                           f"{f' (the daemon runs as uid {os.getuid()})' if e.errno == 13 else ''}",
                           subject="key") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InvalidInput(f"{key!r} is not a shared memory object", subject="key")
    return fd, st


def register_fields(doc: Any, name: str) -> tuple[str, int, int]:
    """(key, offset, byte_size) of a register request's JSON (unchecked key)."""
    if type(doc) is not dict:
        raise InvalidInput("a register request must be a JSON object with key, offset and byte_size", subject=name)
    offset, size = doc.get("offset", 0), doc.get("byte_size")
    if type(offset) is not int or offset < 0:
        raise InvalidInput(f"region {name!r}: offset must be an integer >= 0, not {offset!r}", subject=name)
    if type(size) is not int or size <= 0:
        raise InvalidInput(f"region {name!r}: byte_size must be an integer > 0, not {size!r}", subject=name)
    return doc.get("key"), offset, size  # type: ignore[return-value]  # the key is checked by the caller


def open_region(key: str, name: str, offset: int, size: int) -> tuple[int, os.stat_result]:
    """open_object, read-write (runners write outputs into it), once the
    object holds the region's bytes."""
    fd, st = open_object(key, writable=True)
    if st.st_size < offset + size:
        os.close(fd)
        raise InvalidInput(f"region {name!r}: offset {offset} + byte_size {size} runs past the end of the "
                           f"{st.st_size}-byte object {key!r}", subject=name)
    return fd, st


def read_region(fd: int, at: int, size: int, what: str, region: str) -> bytearray:
    """``size`` bytes at ``at``, read (pread cannot SIGBUS where a mapping
    of a truncated object would)."""
    out = bytearray(size)
    done = 0
    while done < size:
        got = os.preadv(fd, [memoryview(out)[done:]], at + done)
        if got == 0:
            raise InvalidInput(f"{what}: shared memory region {region!r} ended while being read (truncated)",
                               subject=what)
        done += got
    return out


def object_size_problem(fd: int, key: str, end: int) -> str | None:
    """Why the object no longer holds ``end`` bytes (it was truncated), or
    None. Touching mapped pages past an object's end is SIGBUS, so this is
    asked before every use."""
    size = os.fstat(fd).st_size
    if size < end:
        return f"its object {key!r} is now {size} bytes, short of the {end} bytes it was registered with " \
               f"(truncated)"
    return None


def unlinked_problem(fd: int, key: str) -> str | None:
    """Why ``key`` no longer names the object ``fd`` is open on (unlinked,
    or replaced by another object of that name), or None."""
    held = os.fstat(fd)
    try:
        now = os.stat(SHM_DIR / object_name(key), follow_symlinks=False)
    except FileNotFoundError:
        return f"its object {key!r} was unlinked"
    if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
        return f"its object {key!r} was unlinked and another object took its name"
    return None
