"""The mount calls: mount(2) and umount2(2) through ctypes, so the plugin's
image needs no util-linux and each flag is the one the kernel gets (a bind
mount ignores MS_RDONLY on its first call: read-only takes a remount of the
bind, MS_REMOUNT|MS_BIND|MS_RDONLY, as mount(8) does for ``-o bind,ro``)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from cartonstore.errors import CartonStoreError
from cartonstore.system.libc import libc

from .mountinfo import Mount, parse_mountinfo

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
READ_ONLY_BIND = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
MOUNTINFO = Path("/proc/self/mountinfo")


class MountFailed(CartonStoreError):
    """A mount or unmount the kernel refused; ``errno`` says why."""

    def __init__(self, message: str, errno: int) -> None:
        super().__init__(message)
        self.errno = errno


def _call(name: str, *args: object) -> None:
    c = libc()
    if c is None:
        raise MountFailed(f"{name}: the C library cannot be loaded", 0)
    if getattr(c, name)(*args) != 0:
        err = ctypes.get_errno()
        raise MountFailed(f"{name}: {os.strerror(err)}", err)


def bind_read_only(source: Path, target: Path) -> None:
    """Bind ``source`` at ``target``, read-only, nosuid, nodev; on a failed
    remount the bind is undone, so nothing writable is left mounted."""
    _call("mount", os.fsencode(source), os.fsencode(target), None, ctypes.c_ulong(MS_BIND), None)
    try:
        _call("mount", None, os.fsencode(target), None, ctypes.c_ulong(READ_ONLY_BIND), None)
    except MountFailed:
        unmount(target)
        raise


def unmount(target: Path) -> None:
    _call("umount2", os.fsencode(target), ctypes.c_int(0))


def read_mounts() -> list[Mount]:
    return parse_mountinfo(MOUNTINFO.read_text())
