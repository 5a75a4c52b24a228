"""Who is on the other end of a Unix socket, and files opened with their rights.

A daemon running as root reads a path a caller names only as that caller:
a thread of its own takes the caller's filesystem identity (fsuid, fsgid,
supplementary groups) and drops its effective capabilities, each by a raw
syscall, which on Linux changes the calling thread alone (glibc's
setgroups() would change every thread of the process). The kernel then
checks every open as it would the caller's own (modes, ACLs, LSMs), at the
moment of the open, so there is no window between a check and the use. The
descriptors it opens are read by any thread. A daemon that cannot take
another identity (not root, no CAP_SETUID and CAP_SETGID) refuses a caller
of another uid, by name.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from cartonstore.errors import PermissionDenied

T = TypeVar("T")

_UCRED = struct.Struct("3i")
SO_PEERGROUPS = 59          # Linux 4.13+; the same number on x86_64 and aarch64 (asm-generic)
# The most supplementary groups read of a peer: CPython's getsockopt takes at most 1024 bytes. For a peer in
# more (NGROUPS_MAX is 65536) the kernel answers ERANGE; it is not read as with some left out, since a group
# may be denied what others may.
MAX_PEER_GROUPS = 256
_CAP_VERSION_3 = 0x20080522
_QUERY = 0xFFFFFFFF         # (uid_t)-1: setfsuid/setfsgid change nothing and tell the current id


@dataclass(frozen=True)
class Credentials:
    """A process's identity as the kernel checks file access against it.
    ``groups`` None: its supplementary groups could not be read (files are
    then not read as it)."""

    uid: int
    gid: int
    groups: tuple[int, ...] | None = ()


def peer_credentials(sock: socket.socket) -> Credentials:
    """The credentials of a Unix socket's peer as they were when it
    connected (SO_PEERCRED, SO_PEERGROUPS). Groups None where the kernel
    would not tell them all: more than MAX_PEER_GROUPS, or a kernel before
    4.13 (CallerRights then refuses to read as the peer)."""
    _pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return Credentials(uid, gid, _peer_groups(sock))


def _peer_groups(sock: socket.socket) -> tuple[int, ...] | None:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, MAX_PEER_GROUPS * 4)
    except OSError:   # ERANGE: more groups than asked for; ENOPROTOOPT: a kernel before 4.13
        return None
    return struct.unpack(f"{len(raw) // 4}I", raw[:len(raw) // 4 * 4])


def denied(path: object, creds: Credentials) -> PermissionDenied:
    """The refusal of a path a caller may not read: the path they named and
    who they are, nothing of what lies behind it."""
    return PermissionDenied(f"permission denied: {path} (as uid {creds.uid})", subject=str(path))


class OwnRights:
    """File access with this process's own rights (the CLI, a user adding
    their own files): calls run where they are made."""

    switched = False

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    def close(self) -> None:
        pass

    def __enter__(self) -> OwnRights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


OWN_RIGHTS = OwnRights()


class CallerRights(OwnRights):
    """File access with a caller's rights. ``run(fn, *args)`` calls fn in
    a thread that holds the caller's identity (from any thread; calls made
    from inside it run at once); a PermissionError it raises becomes a
    PermissionDenied naming the path and the caller's uid. A caller of this
    process's own uid needs no thread: its calls run where they are made.
    Raises PermissionDenied when this process cannot take the identity.
    Close it (or use it as a context manager) to end the thread."""

    def __init__(self, creds: Credentials) -> None:
        self.creds = creds
        self.switched = creds.uid != os.geteuid()
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple, concurrent.futures.Future] | None] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if self.switched:
            became: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._thread = threading.Thread(target=self._serve, args=(became,), daemon=True,
                                            name=f"cartonstore-as-uid-{creds.uid}")
            self._thread.start()
            try:
                became.result()
            except BaseException:
                self._thread.join()
                self._thread = None
                raise

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            if not self.switched or threading.current_thread() is self._thread:
                return fn(*args)
            if self._thread is None:   # never with this process's rights instead
                raise RuntimeError(f"the thread reading as uid {self.creds.uid} was closed")
            done: concurrent.futures.Future[T] = concurrent.futures.Future()
            self._calls.put((fn, args, done))
            return done.result()
        except PermissionError as e:
            raise denied(e.filename if e.filename is not None else "(a file of the source)", self.creds) from None

    def close(self) -> None:
        if self._thread is not None:
            self._calls.put(None)
            self._thread.join()
            self._thread = None

    def _serve(self, became: concurrent.futures.Future) -> None:
        try:
            _become(self.creds)
        except BaseException as e:  # noqa: BLE001 - told to the constructor, which raises it
            became.set_exception(e)
            return
        became.set_result(None)
        while (call := self._calls.get()) is not None:
            fn, args, done = call
            try:
                done.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - the caller of run() raises it
                done.set_exception(e)


def rights_of(creds: Credentials | None) -> OwnRights:
    """The rights a file access for ``creds`` runs with; None: this process's own."""
    return OWN_RIGHTS if creds is None else CallerRights(creds)


def _become(creds: Credentials) -> None:
    """Give the calling thread the caller's filesystem identity and no
    effective capability (CAP_DAC_OVERRIDE and the like would read past
    the identity; the thread needs none once it has taken it)."""
    import ctypes

    from .syscalls import syscall

    if creds.groups is None:
        raise PermissionDenied(
            f"cannot read files as uid {creds.uid}: the kernel did not tell all of its supplementary groups (a "
            f"caller in more than {MAX_PEER_GROUPS} groups, or Linux before 4.13), and read without some of them it "
            "could be let in where one of those is shut out: give a URL, upload the carton (file: "
            f"parameters), or ask from a process in at most {MAX_PEER_GROUPS} groups", subject="source")
    refusal = PermissionDenied(
        f"the daemon runs as uid {os.geteuid()} and cannot read files as uid {creds.uid} (taking a caller's "
        "identity needs root, or CAP_SETUID and CAP_SETGID): give a URL, upload the carton (file: parameters), "
        f"or ask as uid {os.geteuid()}", subject="source")
    try:
        groups = (ctypes.c_uint32 * max(1, len(creds.groups)))(*creds.groups)
        syscall("setgroups", ctypes.c_size_t(len(creds.groups)), groups)
        # setfsuid and setfsgid tell the previous id, never an error: asked again, they show whether it took.
        for call, wanted in (("setfsgid", creds.gid), ("setfsuid", creds.uid)):
            syscall(call, ctypes.c_uint32(wanted))
            if syscall(call, ctypes.c_uint32(_QUERY)) != wanted:
                raise refusal
        header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()   # two {effective, permitted, inheritable}
        syscall("capget", header, data)
        data[0] = data[3] = 0
        syscall("capset", header, data)
    except OSError:   # ENOSYS: not Linux on a machine syscalls.py knows; EPERM: no CAP_SETGID
        raise refusal from None
