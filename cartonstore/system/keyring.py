"""Kernel keyrings: a process starts with its parent's session keyring, so
a runner would otherwise possess every key its daemon's session holds (and
share a covert channel with every other runner). ``join_new_session`` gives
this process an anonymous session keyring of its own, owned by its uid
then: call it after the change of user.

keyctl through libc's syscall(): keyutils' libkeyutils is not needed.
"""

from __future__ import annotations

import ctypes
import errno

from .syscalls import syscall

KEYCTL_GET_KEYRING_ID, KEYCTL_JOIN_SESSION_KEYRING = 0, 1
KEY_SPEC_SESSION_KEYRING = -3


def keyctl(operation: int, *args: object) -> int:
    """keyctl(2); OSError when it fails."""
    return syscall("keyctl", ctypes.c_int(operation), *args)


def join_new_session() -> int:
    """Leave the inherited session keyring for a new anonymous one; its serial number."""
    return keyctl(KEYCTL_JOIN_SESSION_KEYRING, ctypes.c_char_p(None))


def unavailable() -> str | None:
    """Why no keyring can be reached from here (none to share then, none
    to join), or None where keyrings are."""
    try:
        keyctl(KEYCTL_GET_KEYRING_ID, ctypes.c_int(KEY_SPEC_SESSION_KEYRING), ctypes.c_int(0))
    except OSError as e:
        if e.errno == errno.ENOSYS:
            return "this kernel has no keyrings (keyctl: ENOSYS)"
        if e.errno in (errno.EPERM, errno.EACCES):
            return "keyctl is denied to the daemon (a seccomp filter around it)"
        # ENOKEY: no session keyring yet; keyrings are there
    return None
