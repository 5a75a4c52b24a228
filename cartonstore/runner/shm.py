"""A runner's side of Triton's system shared-memory extension: regions
registered with it are mapped once, and the tensors of a request that
names them are numpy views of the mapping (inputs) or are copied into it
(outputs), so their bytes never cross the runner's socket.

Regions are registered by the daemon (cartonstore.server.runner_processes.shm_link),
or by anyone talking to a runner directly; the runner's socket is the
daemon's alone (mode 0600), so there is no owner to check here.

Touching a mapped page past the end of a truncated object is SIGBUS, which
Python cannot turn into an exception; so the object's size is checked
when a request takes a view and again right before outputs are written.
An object truncated while the model reads it, or in the instant between
that check and an output's copy, still kills the runner (the daemon
answers 503 and restarts it). Only the daemon's own uid can do that:
regions another uid may truncate (theirs, or writable by group or others)
are read into copies and written with pwrite. The daemon itself never
maps a region.
"""

from __future__ import annotations

import mmap
import os
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any

from cartonstore.errors import InvalidInput
from cartonstore.system.shm_objects import object_size_problem, open_region, read_region, register_fields
from cartonstore.v2.shared_memory import RegionShrunk, ShmRef, ShmSink, check_within, missing_region

from .protocol import ARENA_FD_ENV, ARENA_REGION, SHM_CHANNEL_ENV, SHM_COPY_INPUTS, SHM_FD_PASSED, SHM_OBJECT

_PAGE = mmap.ALLOCATIONGRANULARITY


@dataclass(eq=False)
class MappedRegion:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    mapping: mmap.mmap
    view: memoryview      # the region's bytes within the mapping
    copy_inputs: bool = False   # another uid may truncate it: inputs copied, outputs written with pwrite

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def release(self) -> None:
        """Unmap, unless a tensor still holds a view (then the mapping goes
        when the last view does)."""
        os.close(self.fd)
        try:
            self.view.release()
            self.mapping.close()
        except BufferError:
            pass


class MappedRegions:
    def __init__(self) -> None:
        self._regions: dict[str, MappedRegion] = {}
        self._lock = threading.Lock()   # requests take views in worker threads
        self._channel: socket.socket | None = None   # the daemon's fds, in a sandbox (SHM_CHANNEL_ENV)
        self._handed: dict[str, int] = {}             # fds received and not yet registered, by region name
        if (text := os.environ.get(SHM_CHANNEL_ENV)) and text.isdigit():
            self._channel = socket.socket(fileno=int(text))
            self._channel.setblocking(False)

    def _handed_fd(self, name: str) -> int:
        """The fd the daemon sent for region ``name`` (it sends before it
        registers: the datagram is queued by now)."""
        if self._channel is None:
            raise InvalidInput(f"region {name!r}: the daemon handed an fd, but this runner has no channel for it")
        with self._lock:
            while name not in self._handed:
                try:
                    msg, fds, _flags, _addr = socket.recv_fds(self._channel, 1024, 1)
                except BlockingIOError:
                    raise InvalidInput(f"region {name!r}: the daemon's fd for it did not arrive") from None
                for fd in fds:   # a region sent again replaces what came before
                    old = self._handed.pop(region := msg.decode(errors="replace"), None)
                    if old is not None:
                        os.close(old)
                    self._handed[region] = fd
            return self._handed.pop(name)

    def register(self, name: str, doc: Any) -> None:
        key, offset, size = register_fields(doc, name)
        if name == ARENA_REGION:
            raise InvalidInput(f"region name {name!r} is reserved for the daemon's tensor arena", subject=name)
        with self._lock:
            known = self._regions.get(name)
            if known is not None:
                if (known.key, known.offset, known.byte_size) == (key, offset, size):
                    return   # the same registration again (a caller retrying after a lost answer)
                raise InvalidInput(f"shared memory region {name!r} is already registered", subject=name)
        if doc.get(SHM_FD_PASSED) is True:   # sandboxed: no /dev/shm to open it by name
            fd = self._handed_fd(name)
            st = os.fstat(fd)
            if st.st_size < offset + size:
                os.close(fd)
                raise InvalidInput(f"region {name!r}: offset {offset} + byte_size {size} runs past the end of the "
                                   f"{st.st_size}-byte object {key!r}", subject=name)
        else:
            fd, st = open_region(key, name, offset, size)
        try:
            expected = doc.get(SHM_OBJECT)
            if expected is not None and list(expected) != [st.st_dev, st.st_ino]:
                raise InvalidInput(f"region {name!r}: {key!r} now names another object than the one the daemon "
                                   f"checked (replaced since)", subject=name)
            start = offset - offset % _PAGE
            mapping = mmap.mmap(fd, offset + size - start, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                                offset=start)
        except BaseException:
            os.close(fd)
            raise
        region = MappedRegion(name, key, offset, size, fd, mapping,
                              memoryview(mapping)[offset - start: offset - start + size],
                              doc.get(SHM_COPY_INPUTS) is True)
        with self._lock:
            if name in self._regions:
                region.release()
                raise InvalidInput(f"shared memory region {name!r} is already registered", subject=name)
            self._regions[name] = region

    def adopt_arena(self) -> bool:
        """Map the daemon's tensor arena when this process inherited it
        (ARENA_FD_ENV); True when mapped. The daemon sealed it against
        shrinking, so its mapping is read and written directly."""
        text = os.environ.get(ARENA_FD_ENV)
        if not text:
            return False
        try:
            fd = int(text)
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (ValueError, OSError) as e:   # started by hand with a stale variable: serve without it
            print(f"cartonstore runner: {ARENA_FD_ENV}={text!r} is not usable ({e}); serving without the "
                  f"daemon's tensor arena", file=sys.stderr, flush=True)
            return False
        with self._lock:
            self._regions[ARENA_REGION] = MappedRegion(ARENA_REGION, f"fd {fd}", 0, size, fd, mapping,
                                                       memoryview(mapping))
        return True

    def arena_sink(self, offset: int, size: int) -> ShmSink:
        """``size`` bytes at ``offset`` of the arena, for one output."""
        with self._lock:
            region = self._usable(ShmRef(ARENA_REGION, offset, size), "the daemon's arena outputs")
            return ShmSink(ARENA_REGION, region.view[offset:offset + size], offset)

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        with self._lock:   # the arena is not a registered region: never listed
            if name is None:
                return [self._regions[n].status() for n in sorted(self._regions) if n != ARENA_REGION]
            if name not in self._regions or name == ARENA_REGION:
                raise InvalidInput(f"unable to find system shared memory region: {name!r}", subject=name)
            return [self._regions[name].status()]

    def unregister(self, name: str | None = None) -> None:
        with self._lock:   # the arena is the daemon's for this process's life: never unregistered
            names = [n for n in self._regions if n != ARENA_REGION] if name is None else \
                [name] if name in self._regions and name != ARENA_REGION else []
            gone = [self._regions.pop(n) for n in names]
        for region in gone:
            region.release()

    def _usable(self, ref: ShmRef, what: str) -> MappedRegion:
        """The region ``ref`` names, once it holds the bytes named and its
        object still holds the region (call with the lock held)."""
        region = self._regions.get(ref.region)
        if region is None:
            raise missing_region(ref, what)
        check_within(ref, region.byte_size, what)
        problem = object_size_problem(region.fd, region.key, region.offset + region.byte_size)
        if problem:
            raise InvalidInput(f"{what}: shared memory region {ref.region!r} cannot be used: {problem}",
                               subject=what)
        return region

    def check(self, ref: ShmRef, what: str) -> None:
        with self._lock:
            self._usable(ref, what)

    def input_bytes(self, ref: ShmRef, what: str) -> memoryview:
        """An input's bytes: a view of the mapping, or, for a region of
        another uid than the daemon's, a copy read with pread. Only the
        daemon's own uid may make a runner's reads SIGBUS by truncating a
        region: another uid could otherwise crash a runner every uid uses."""
        with self._lock:
            region = self._usable(ref, what)
            if not region.copy_inputs:
                return region.view[ref.offset:ref.end]
            fd = os.dup(region.fd)   # read outside the lock: an unregister may close the original
        try:
            return memoryview(read_region(fd, region.offset + ref.offset, ref.byte_size, what, ref.region))
        finally:
            os.close(fd)

    def sink(self, ref: ShmRef, what: str) -> ShmSink:
        """Where an output named ``ref`` is written, its object's size just
        checked (the model has run; it may have shrunk meanwhile). A region
        of the daemon's own uid: straight into the mapping, as its inputs
        are read (numpy's copy lets go of the GIL). Another uid's: through a
        dup of the object's fd (pwrite), so an object truncated meanwhile is
        written past its end (it grows back) instead of raising SIGBUS, which
        would let that uid crash a runner every uid uses. pwrite into tmpfs
        runs at half a copy's speed: 64 MiB took 13.5 ms, against 6.5 ms
        into the mapping. Close it when done."""
        with self._lock:
            region = self._usable(ref, what)
            if not region.copy_inputs:
                return MappedSink(ref.region, region.view[ref.offset:ref.end], os.dup(region.fd), region.key,
                                  region.offset + ref.end, what)
            return FdSink(ref.region, os.dup(region.fd), region.offset + ref.offset, ref.byte_size)

    def close(self) -> None:
        self.unregister()
        with self._lock:
            for fd in self._handed.values():
                os.close(fd)
            self._handed.clear()


class MappedSink(ShmSink):
    """An output copied into the runner's mapping of a region. The object's
    size is checked again right before the copy: outputs encoded before
    this one (JSON, BYTES) may take a while, and a truncation meanwhile
    would be SIGBUS. Through a dup of its fd: an unregister may close the
    region's own."""

    def __init__(self, region: str, view: memoryview, fd: int, key: str, end: int, what: str) -> None:
        super().__init__(region, view)
        self._fd, self._key, self._end, self._what = fd, key, end, what

    def write(self, chunk: bytes | memoryview) -> None:
        problem = object_size_problem(self._fd, self._key, self._end)
        if problem:
            raise RegionShrunk(f"{self._what}: shared memory region {self.region!r} cannot be used: {problem}",
                               subject=self._what)
        super().write(chunk)

    def close(self) -> None:
        os.close(self._fd)


class FdSink(ShmSink):
    def __init__(self, region: str, fd: int, at: int, capacity: int) -> None:
        self.region, self.capacity = region, capacity
        self._fd, self._at = fd, at

    def write(self, chunk: bytes | memoryview) -> None:
        view = memoryview(chunk).cast("B")
        done = 0
        while done < len(view):   # pwrite lets go of the GIL, and may write less than asked
            done += os.pwrite(self._fd, view[done:], self._at + done)

    def close(self) -> None:
        os.close(self._fd)
