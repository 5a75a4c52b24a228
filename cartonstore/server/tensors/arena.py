"""The tensor arena: shared memory between the daemon and its runners, so
a big binary infer request crosses a socket twice (client to daemon, daemon
to client) instead of four times.

Why: proxying a 4 MiB tensor each way costs the daemon four kernel copies
of it (in from the client, out to the runner, in from the runner, out to
the client) and the runner two more; on two cores that halved throughput
against calling the runner directly (tests/bench/bench_infer.py). With
the arena, the daemon receives the body straight into a slot, tells the
runner where its inputs are (Triton's shared-memory parameters, region
ARENA_REGION), the runner writes its binary outputs into the rest of the
slot (ARENA_OUTPUTS), and the daemon sends them to the client from there.

The arena is one memfd, sealed against shrinking and growing, so neither
the daemon nor a runner mapping it can ever touch a page past its end
(SIGBUS); runners inherit its fd at spawn (ARENA_FD_ENV). Slots are
page-aligned spans, first fit, so touched pages stay few and low; when
the arena has stayed idle for TRIM_IDLE seconds, pages past TRIM_KEEP are
given back to the kernel (not at every idle moment: one client sending
big tensors one after another would fault them all in again each time).

A slot is released once its answer is written, or, when a runner failed
to answer (it may still be writing outputs into the slot), only after that
runner process has exited (hold_until).
"""

from __future__ import annotations

import asyncio
import bisect
import fcntl
import logging
import mmap
import os
from collections.abc import Awaitable

from cartonstore.runner.protocol import ARENA_FD_ENV

log = logging.getLogger("cartonstore.server")

__all__ = ["ARENA_FD_ENV", "ARENA_FROM", "DEFAULT_SIZE", "ArenaSlot", "TensorArena"]
DEFAULT_SIZE = 1 << 30      # address space: pages are memory only once a request touches them
ARENA_FROM = 256 * 1024      # smaller bodies are copied: a slot and a rewritten header cost more than they save
TRIM_KEEP = 64 << 20         # resident bytes kept when idle
TRIM_IDLE = 5.0              # seconds without a slot before pages past TRIM_KEEP are given back
_PAGE = mmap.PAGESIZE


def _aligned(size: int) -> int:
    return -(-size // _PAGE) * _PAGE


class ArenaSlot:
    """``size`` bytes at ``offset`` in the arena; ``view`` is them."""

    def __init__(self, arena: TensorArena, offset: int, size: int) -> None:
        self.arena = arena
        self.offset = offset
        self.size = size
        self.view = arena.view[offset:offset + size]
        self._released = False
        self._held = False

    def release(self) -> None:
        """Give the span back (again: nothing); not while held."""
        if self._released or self._held:
            return
        self._released = True
        self.arena._free(self.offset)  # noqa: SLF001 - a slot is a part of its arena

    def hold_until(self, exited: Awaitable[object]) -> None:
        """Keep the span until ``exited`` (a runner process's end): a runner
        that did not answer may still write into it."""
        if self._released or self._held:
            return
        self._held = True

        async def later() -> None:
            try:
                await exited
            finally:
                self._held = False
                self.release()
        self.arena._track(asyncio.ensure_future(later()))  # noqa: SLF001 - a slot is a part of its arena


class TensorArena:
    def __init__(self, size: int, *, trim_idle: float = TRIM_IDLE) -> None:
        self.size = _aligned(size)
        self.trim_idle = trim_idle
        self.fd = os.memfd_create("cartonstore-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self._map)
        self._spans: list[tuple[int, int]] = []   # (start, end) of taken spans, sorted
        self._limit = self.size            # spans end below this (lowered while a trim runs)
        self._touched = 0                  # highest end handed out since the last trim
        self._trim_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.retiring = False   # its model was unloaded: closed once its last slot is given back
        self.forwarded = 0    # requests sent to a runner in the arena's form (arena_wire.py counts them)
        self.full = 0         # slots refused for want of a free span: those bodies were copied

    @property
    def trimming(self) -> bool:
        """Pages are being given back: until that ends, slots end below TRIM_KEEP."""
        return self._limit != self.size

    @property
    def in_use(self) -> int:
        return len(self._spans)

    def stats(self) -> dict[str, int]:
        """For /metrics (read from a worker thread: list() copies at once)."""
        spans = list(self._spans)
        return {"slots": len(spans), "bytes": sum(end - start for start, end in spans),
                "forwarded": self.forwarded, "full": self.full}

    def take(self, size: int) -> ArenaSlot | None:
        """A slot of ``size`` bytes, or None when no span that big is free."""
        if self.closed or self.retiring or size <= 0:
            return None
        want = _aligned(size)
        at = 0
        for start, end in self._spans:
            if start - at >= want:
                break
            at = end
        if at + want > self._limit:
            self.full += 1
            return None
        bisect.insort(self._spans, (at, at + want))
        self._touched = max(self._touched, at + want)
        if self._trim_timer is not None:
            self._trim_timer.cancel()
            self._trim_timer = None
        return ArenaSlot(self, at, size)

    def _free(self, offset: int) -> None:
        del self._spans[bisect.bisect_left(self._spans, (offset,))]
        if self.retiring and not self._spans:
            self.close()
            return
        if self._spans or self._touched <= TRIM_KEEP or self._limit != self.size or self.closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:   # released outside the daemon's loop (a library caller): no timer to wait on
            self._trim()
            return
        if self._trim_timer is None:
            self._trim_timer = loop.call_later(self.trim_idle, self._trim)

    def _trim(self) -> None:
        """Give pages past TRIM_KEEP back (MADV_REMOVE punches them out of
        the memfd), in a thread on the loop: freeing hundreds of MiB takes a while."""
        self._trim_timer = None
        start, end = TRIM_KEEP, self._touched
        self._limit, self._touched = TRIM_KEEP, TRIM_KEEP

        def punch() -> None:
            self._map.madvise(mmap.MADV_REMOVE, start, end - start)

        async def run() -> None:
            try:
                await asyncio.to_thread(punch)
            except (OSError, ValueError) as e:   # not fatal: the pages just stay resident
                log.warning("tensor arena: could not give back %d bytes: %s", end - start, e)
            finally:
                self._limit = self.size
        try:
            asyncio.get_running_loop()
        except RuntimeError:   # released outside the daemon's loop (a library caller): punch here
            try:
                punch()
            finally:
                self._limit = self.size
            return
        self._track(asyncio.ensure_future(run()))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def retire(self) -> None:
        """Its model's runners are gone: no new slot; closed now, or as soon
        as the answers still sent from its slots have left."""
        self.retiring = True
        if not self._spans:
            self.close()

    def close(self) -> None:
        """At daemon shutdown, once no request is left: unmap and close."""
        if self.closed:
            return
        self.closed = True
        if self._trim_timer is not None:
            self._trim_timer.cancel()
        for task in self._tasks:
            task.cancel()
        try:
            self.view.release()
            self._map.close()
        except BufferError:   # a slot still viewed: the mapping goes with the process
            pass
        os.close(self.fd)
