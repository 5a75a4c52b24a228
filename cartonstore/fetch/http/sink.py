"""One worker thread per stream: the event loop only receives.

A body arrives on the event loop in chunks; decoding, hashing and writing
each of them is per-byte work that must not run there. Handing every chunk
to a thread pool costs a future, a wake-up of a worker and a wake-up of the
loop per chunk. A StreamSink instead owns one thread for the whole stream:
the loop drops chunks into a queue (no wake-up of the loop), the thread does
the work in order, and the loop waits only when ``window`` bytes are
queued and not yet done, which bounds the memory a stream holds.

sha256, zlib, zstd, brotli and file writes release the GIL, so the sinks of
several streams run on as many cores.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable

_END = object()


class StreamSink:
    def __init__(self, work: Callable[[bytes], None], *, window: int = 4 << 20, name: str = "stream") -> None:
        """``work(chunk)`` runs in the sink's thread, once per chunk, in order."""
        self._work = work
        self._window = window
        self._loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0                      # bytes queued and not yet done
        self._room: asyncio.Future | None = None  # the loop waits on it while the window is full
        self._error: BaseException | None = None
        self._done = self._loop.create_future()
        self._thread = threading.Thread(target=self._run, name=f"cartonstore-{name}", daemon=True)
        self._thread.start()

    async def put(self, chunk: bytes) -> None:
        """Queue a chunk; waits while the window is full. Raises what the
        work raised on an earlier chunk (the rest is then dropped)."""
        if self._error is not None:
            raise self._error
        with self._lock:
            self._pending += len(chunk)
            full = self._pending >= self._window
            if full:
                self._room = self._loop.create_future()
                room = self._room
        self._queue.put(chunk)
        if full:
            await room
            if self._error is not None:
                raise self._error

    async def close(self) -> None:
        """Wait until every queued chunk is done; raises the work's error."""
        self._queue.put(_END)
        await asyncio.shield(self._done)
        if self._error is not None:
            raise self._error

    async def abort(self) -> None:
        """Drop what is queued and wait for the chunk in hand to finish (so
        nothing writes into a file the caller is about to reuse)."""
        if self._done.done():
            return
        if self._error is None:
            self._error = asyncio.CancelledError()
        self._queue.put(_END)
        await asyncio.shield(self._done)

    async def __aenter__(self) -> StreamSink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Leaving the block, normally or not, writes what was queued (a
        body that broke off keeps the bytes that arrived, so a resume starts
        after them) and raises the work's error; if that wait is itself
        interrupted, the rest is dropped and the chunk in hand waited for,
        so no thread writes into a file its caller is about to reuse."""
        try:
            await self.close()
        finally:
            await self.abort()

    def _run(self) -> None:
        try:
            while (chunk := self._queue.get()) is not _END:
                if self._error is None:
                    try:
                        self._work(chunk)
                    except BaseException as e:  # noqa: BLE001 - handed to the loop
                        self._error = e
                self._release(len(chunk), failed=self._error is not None)
        finally:
            self._loop.call_soon_threadsafe(settle_when_ended, self._thread, lambda: _set_result(self._done))

    def _release(self, length: int, *, failed: bool) -> None:
        with self._lock:
            self._pending -= length
            room = self._room
            if room is None or (self._pending > self._window // 2 and not failed):
                return
            self._room = None
        self._loop.call_soon_threadsafe(_set_result, room)


def _set_result(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def in_own_thread(fn: Callable[[], object], *, name: str) -> asyncio.Future:
    """Run a long blocking job (a hasher following a download) in a thread of
    its own, not the loop's shared executor, whose few threads the short
    jobs (SQLite, fsync, renames) need. Returns a future of its result."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: object, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # noqa: BLE001 - handed to the loop
            result, error = None, e
        loop.call_soon_threadsafe(settle_when_ended, thread, lambda: settle(result, error))

    thread = threading.Thread(target=run, name=f"cartonstore-{name}", daemon=True)
    thread.start()
    return future


ENDED_POLL = 0.0005
"""Seconds between looks at a thread that handed its result over and is
still ending."""


def settle_when_ended(thread: threading.Thread, settle: Callable[[], None]) -> None:
    """On the loop: ``settle()`` once ``thread`` has ended. A thread's last
    act is to hand its result to the loop, and it still runs after that
    (returning, its thread-locals freed): settling at once let a caller,
    a cancelled pull among them, return with the thread still alive
    (seen as a leftover thread under load). Polled, not joined: the loop
    never blocks on it."""
    if thread.is_alive():
        asyncio.get_running_loop().call_later(ENDED_POLL, settle_when_ended, thread, settle)
    else:
        settle()
