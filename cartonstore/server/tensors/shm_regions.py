"""The daemon's registry of Triton system shared-memory regions.

A region is a client's name for byte_size bytes at offset into a POSIX
shared memory object (the "key"). Regions belong to whoever registered
them: a Unix-socket client is known by its uid (SO_PEERCRED), so one uid
never sees, uses or unregisters another's regions, and may register only
objects it owns. TCP clients, where a setting lets them, share one
namespace and may register only objects the daemon's own uid owns.

The daemon never maps a region: runners do, and the bytes of a tensor go
from the client's memory to the model without passing through here. The
daemon keeps an fd on each object to check, at every use, that the object
still is what was registered (not unlinked, not truncated) and to read
BYTES inputs for validation with pread, which a truncated object cannot
turn into SIGBUS.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from cartonstore.errors import InvalidInput
from cartonstore.system.callers import Credentials, peer_credentials
from cartonstore.system.shm_objects import (
    object_size_problem,
    open_region,
    read_region,
    register_fields,
    unlinked_problem,
)
from cartonstore.v2.shared_memory import ShmRef, check_within, missing_region

MAX_REGIONS = 4096     # per owner: each holds an fd
_NO_GROUP = 65534      # the kernel's overflow gid


@dataclass(frozen=True)
class Peer:
    """Who is on the other end of a connection: ``uid`` over a Unix socket
    (None over TCP), with its group and supplementary groups (files it
    names are read with these: system/callers.py)."""

    uid: int | None
    gid: int | None = None
    groups: tuple[int, ...] | None = ()   # None: more than the kernel could tell (callers.py refuses reading as it)

    @property
    def unix(self) -> bool:
        return self.uid is not None

    @property
    def credentials(self) -> Credentials | None:
        """None over TCP; a peer known by uid alone gets the kernel's
        overflow group, not one it may not be in."""
        if self.uid is None:
            return None
        return Credentials(self.uid, self.gid if self.gid is not None else _NO_GROUP, self.groups)


def peer_of(transport: Any) -> Peer:
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family != socket.AF_UNIX:
        return Peer(None)
    creds = peer_credentials(sock)
    return Peer(creds.uid, creds.gid, creds.groups)


@dataclass(eq=False)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    runner_name: str        # its name on runners, unique for the daemon's life
    gone: bool = False      # unregistered (a runner mapping it meanwhile unmaps it again)
    object_id: tuple[int, int] = (0, 0)   # the object's (st_dev, st_ino): runners must open this one
    foreign: bool = False   # another uid may truncate it: runners copy its inputs, pwrite its outputs (runner/shm.py)
    # the runner links that registered it, told when it goes (weak: a dead runner's link just vanishes)
    links: weakref.WeakSet = field(default_factory=weakref.WeakSet)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class ShmRegions:
    """Every owner's regions. Thread-safe: requests check regions in worker
    threads while the event loop registers and unregisters them."""

    def __init__(self, *, allow_tcp: bool, max_read: int = 256 << 20) -> None:
        self.allow_tcp = allow_tcp
        self.max_read = max_read    # the most bytes read from a region to check them (BYTES inputs)
        self._by_owner: dict[int | None, dict[str, Region]] = {}
        self._lock = threading.Lock()
        self._serial = itertools.count(1)

    def _check_peer(self, peer: Peer) -> None:
        if not peer.unix and not self.allow_tcp:
            raise InvalidInput("system shared memory is served only on the daemon's Unix socket "
                               "(set [server] shared_memory_over_tcp = true to allow it over TCP)",
                               subject="shared_memory")

    def register(self, peer: Peer, name: str, doc: Any) -> Region:
        """Register ``name`` for ``peer`` from a register request's JSON."""
        self._check_peer(peer)
        if not name or len(name) > 255:
            raise InvalidInput(f"a region name must be 1 to 255 characters, not {name!r}", subject=name)
        key, offset, size = register_fields(doc, name)
        unknown = sorted(set(doc) - {"key", "offset", "byte_size"})
        if unknown:
            raise InvalidInput(f"unknown field(s) in the register request: {', '.join(unknown)}", subject=name)
        with self._lock:
            if name in self._by_owner.get(peer.uid, {}):
                raise InvalidInput(f"shared memory region {name!r} is already registered; unregister it first",
                                   subject=name)
        fd, st = open_region(key, name, offset, size)   # read-write as a runner's: a read-only one fails here
        try:
            owner_ok = st.st_uid == (os.getuid() if peer.uid is None else peer.uid) or peer.uid == 0
            if not owner_ok:
                who = "the daemon's uid" if peer.uid is None else f"your uid {peer.uid}"
                raise InvalidInput(f"shared memory object {key!r} belongs to uid {st.st_uid}, not {who}: "
                                   f"only its owner may register it", subject="key")
            region = Region(name, key, offset, size, fd, f"cs{next(self._serial)}",
                            object_id=(st.st_dev, st.st_ino), foreign=_others_can_truncate(st))
            with self._lock:
                owned = self._by_owner.setdefault(peer.uid, {})
                if name in owned:
                    raise InvalidInput(f"shared memory region {name!r} is already registered", subject=name)
                if len(owned) >= MAX_REGIONS:
                    raise InvalidInput(f"{MAX_REGIONS} regions are registered already; unregister some first",
                                       subject=name)
                owned[name] = region
        except BaseException:
            os.close(fd)
            raise
        return region

    def status(self, peer: Peer, name: str | None = None) -> list[dict[str, Any]]:
        self._check_peer(peer)
        with self._lock:
            owned = self._by_owner.get(peer.uid, {})
            if name is None:
                return [owned[n].status() for n in sorted(owned)]
            if name not in owned:
                raise InvalidInput(f"unable to find system shared memory region: {name!r}", subject=name)
            return [owned[name].status()]

    def unregister(self, peer: Peer, name: str | None = None) -> list[Region]:
        """Forget one region of ``peer`` (all of them when ``name`` is None);
        an unknown name is no error, as in Triton. The regions removed are
        returned for their runner links to be told."""
        self._check_peer(peer)
        with self._lock:
            owned = self._by_owner.get(peer.uid, {})
            gone = list(owned.values()) if name is None else [owned[name]] if name in owned else []
            for region in gone:
                del owned[region.name]
                region.gone = True
                os.close(region.fd)
        return gone

    def close(self) -> list[Region]:
        with self._lock:
            gone = [r for owned in self._by_owner.values() for r in owned.values()]
            self._by_owner.clear()
            for region in gone:
                region.gone = True
                os.close(region.fd)
        return gone

    def check(self, peer: Peer, ref: ShmRef, what: str, *,
              read: bool = False) -> tuple[Region, bytes | bytearray | None]:
        """The region ``ref`` names, once the bytes it names lie inside it
        and its object is still the one registered, whole; with ``read``,
        also those bytes (read, not mapped). InvalidInput says what is wrong."""
        self._check_peer(peer)
        with self._lock:
            region = self._by_owner.get(peer.uid, {}).get(ref.region)
            if region is None:
                raise missing_region(ref, what)
            check_within(ref, region.byte_size, what)
            problem = unlinked_problem(region.fd, region.key) or \
                object_size_problem(region.fd, region.key, region.offset + region.byte_size)
            if problem:
                raise InvalidInput(f"{what}: shared memory region {ref.region!r} cannot be used: {problem}",
                                   subject=what)
            fd = os.dup(region.fd) if read else -1   # read outside the lock: an unregister may close the original
        if not read:
            return region, None
        try:
            return region, read_region(fd, region.offset + ref.offset, ref.byte_size, what, ref.region)
        finally:
            os.close(fd)


def _others_can_truncate(st: os.stat_result) -> bool:
    """Whether a uid other than the daemon's can truncate the object: it
    is theirs, or its group or anyone may write it. Runners then copy its
    inputs and pwrite its outputs: a truncation under their mapping would
    be SIGBUS, a crash of a runner every uid uses (runner/shm.py)."""
    return st.st_uid != os.getuid() or bool(st.st_mode & 0o022)
