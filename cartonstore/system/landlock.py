"""Landlock (Linux 5.13+): a process takes away its own rights to the
filesystem, to TCP and to signals, for itself and everything it starts,
with no privilege needed. What is not granted by a rule is denied.

By ABI version (landlock_create_ruleset(NULL, 0, VERSION)): 1 the
filesystem, 2 REFER (renames across directories), 3 TRUNCATE, 4 TCP bind
and connect, 5 IOCTL_DEV on device files, 6 scoping (abstract Unix sockets
and signals to processes outside the domain). A right the running kernel
does not know is left out of what is handled, so a ruleset built for a
newer ABI still restricts what the kernel can.

    restrict(read=["/usr", model_dir], write=["/tmp/x"], devices=["/dev/null"], deny_tcp=True)
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .syscalls import PR_SET_NO_NEW_PRIVS, prctl, syscall

_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
BIND_TCP, CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
READ = EXECUTE | READ_FILE | READ_DIR
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV   # what a rule on a file (not a dir) may hold


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class LandlockError(OSError):
    """Landlock could not be applied: the process is not restricted."""


def _landlock(call: Callable[..., int], *args: object) -> int:
    """``call(*args)``, its OSError as a LandlockError."""
    try:
        return call(*args)
    except OSError as e:
        raise LandlockError(e.errno, e.strerror) from None


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is off or absent."""
    try:
        return _landlock(syscall, "landlock_create_ruleset", None, ctypes.c_size_t(0),
                         ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except LandlockError:
        return 0


@dataclass(frozen=True)
class Granted:
    """What a restricted process may still do, beyond which it may not."""

    read: tuple[str, ...] = ()       # read and execute, files and directories beneath
    write: tuple[str, ...] = ()      # everything beneath (a private /tmp)
    devices: tuple[str, ...] = ()    # device files to read, write and ioctl (/dev/null, GPUs)
    deny_tcp: bool = True            # no TCP bind or connect (ABI 4+)
    scope: bool = True               # no signals to, no abstract sockets of, processes outside (ABI 6+)


def restrict(granted: Granted) -> list[str]:
    """Restrict this process (and what it execs and forks) to ``granted``.
    Returns what holds, in words ("fs", "tcp", "signals"); raises
    LandlockError where Landlock is unavailable. Paths that do not exist
    are skipped."""
    abi = abi_version()
    if abi < 1:
        raise LandlockError(95, "Landlock is not enabled in this kernel (it needs 5.13+ and lsm=landlock)")
    fs = _FS_BY_ABI[max(k for k in _FS_BY_ABI if k <= abi)]
    net = BIND_TCP | CONNECT_TCP if abi >= 4 and granted.deny_tcp else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 and granted.scope else 0
    attr = _RulesetAttr(fs, net, scoped)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16   # older kernels take the first two fields
    ruleset = _landlock(syscall, "landlock_create_ruleset", ctypes.byref(attr), ctypes.c_size_t(size),
                        ctypes.c_uint32(0))
    try:
        _add_paths(ruleset, granted.read, READ & fs)
        _add_paths(ruleset, granted.write, fs)
        _add_paths(ruleset, granted.devices, (READ_FILE | WRITE_FILE | IOCTL_DEV | TRUNCATE) & fs)
        _landlock(prctl, PR_SET_NO_NEW_PRIVS, 1)   # what lets a process without privilege restrict itself
        _landlock(syscall, "landlock_restrict_self", ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return ["fs"] + (["tcp"] if net else []) + (["signals"] if scoped else [])


def _add_paths(ruleset: int, paths: Iterable[str], access: int) -> None:
    for path in paths:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            allowed = access if os.path.isdir(path) else access & FILE_RIGHTS
            rule = _PathBeneath(allowed, fd)
            _landlock(syscall, "landlock_add_rule", ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                      ctypes.byref(rule), ctypes.c_uint32(0))
        finally:
            os.close(fd)
