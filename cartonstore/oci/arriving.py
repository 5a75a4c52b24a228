"""A blob read by its callers while it is still being fetched.

The fetch writes the blob into its ingest file (store/content/blobs.py,
BlobWriter); each caller opens that file for itself and reads the bytes
that have landed, from the start of the file without a gap, as they land.
A caller's last byte waits for the verification of the whole blob: a blob
that does not hash to its digest ends every caller's answer with an error
(the connection is cut), never a clean end over wrong bytes. A fetch that
starts writing the file again from the start (a body that cannot resume)
cuts the callers that were already sent bytes: what they were sent may not
be what is written now.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cartonstore.errors import IntegrityError
from cartonstore.store.content.blobs import BlobWriter
from cartonstore.system.waiters import Broadcast

CHUNK = 1 << 20
# Bytes land in the fetch's own threads, which wake the callers waiting for
# them (BlobWriter.on_landed); a caller looks again at least this often all
# the same, whatever a writer does.
LOOK_AGAIN_SECONDS = 0.25


class Arriving:
    """One blob's fetch as its callers see it: the writer it lands in,
    ``size`` when a manifest gave it, and ``verified`` (its staged size, or
    the fetch's error). ``finished``: the fetch's owner is done with it
    (committed, or failed)."""

    def __init__(self, digest: str, size: int | None, stored_path: Path) -> None:
        self.digest = digest
        self.size = size
        self.stored_path = stored_path   # where its file is once committed
        self.writer: BlobWriter | None = None
        loop = self._loop = asyncio.get_running_loop()
        self._woken = Broadcast()              # bytes landed (or the file started again)
        self._waiting = 0                      # callers waiting for bytes to land
        self._wake_pending = False             # a wake-up is on its way to the loop
        self.verified: asyncio.Future[int] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        for future in (self.verified, self.finished):   # a fetch nobody reads still has its error retrieved
            future.add_done_callback(lambda f: f.cancelled() or f.exception())

    def watch(self, writer: BlobWriter) -> None:
        """fetch_blob's hook: the file this fetch writes now."""
        self.writer = writer
        writer.on_landed = self._landed

    def _landed(self) -> None:
        """In the writing thread: more landed; wake the waiting callers, once
        per turn of the loop."""
        if self._waiting and not self._wake_pending:
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._wake)
            except RuntimeError:   # the loop closed (the daemon stopped): no one is left to wake
                pass

    def _wake(self) -> None:
        self._wake_pending = False
        self._woken.wake()

    @property
    def landing(self) -> asyncio.Event:
        """Set at the next wake-up: more bytes landed, or the file started again."""
        return self._woken.next()

    @contextmanager
    def followed(self) -> Iterator[None]:
        """While a caller looks for bytes: the writer's thread wakes it."""
        self._waiting += 1
        try:
            yield
        finally:
            self._waiting -= 1

    def fetched(self, fetch: asyncio.Future) -> None:
        """The fetch's done callback: ``verified`` is its staged size or its error."""
        if self.verified.done():
            return
        error = None if fetch.cancelled() else fetch.exception()
        if fetch.cancelled():
            self.verified.set_exception(IntegrityError(f"the fetch of blob sha256:{self.digest} was stopped",
                                                       subject=self.digest))
        elif error is not None:
            self.verified.set_exception(error)
        else:
            self.verified.set_result(fetch.result().size)

    def end(self, error: BaseException | None) -> None:
        """The owner is done: the blob is committed (no ``error``) or not."""
        if self.finished.done():
            return
        if error is None:
            self.finished.set_result(None)
        else:
            self.finished.set_exception(error if isinstance(error, Exception) else
                                        IntegrityError(f"the fetch of blob sha256:{self.digest} was stopped",
                                                       subject=self.digest))

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The blob's bytes from its start, each as soon as it has landed; the
        last after the blob is verified. Raises the fetch's error (or
        IntegrityError) instead of ending where the blob is not what its
        digest says."""
        reader = _Reader(self)
        try:
            while True:
                piece = await reader.next_piece()
                if piece is None:
                    return
                yield piece
        finally:
            reader.close()


class _Reader:
    """One caller's position in the arriving file."""

    def __init__(self, arriving: Arriving) -> None:
        self.arriving = arriving
        self.sent = 0
        self.fd = -1
        self.writer: BlobWriter | None = None
        self.rewrites = 0

    async def next_piece(self) -> bytes | None:
        with self.arriving.followed():   # before looking: bytes that land from now on wake this caller
            return await self._next_piece()

    async def _next_piece(self) -> bytes | None:
        while True:
            woken = self.arriving.landing
            verified = self.arriving.verified
            error = verified.exception() if verified.done() else None
            if error is not None:
                raise error
            size = verified.result() if verified.done() else None
            if size is not None and self.sent >= size:
                return None
            self._follow()
            if self.writer is not None:
                landed = self.writer.landed() if size is None else size
                limit = landed if size is not None else landed - 1   # the last byte waits for verification
                if limit > self.sent:
                    piece = await asyncio.to_thread(os.pread, self.fd, min(CHUNK, limit - self.sent), self.sent)
                    if not piece:   # the file is shorter than what landed: it was started again under us
                        raise self._rewritten()
                    self.sent += len(piece)
                    return piece
            wake = asyncio.ensure_future(woken.wait())
            either: list[asyncio.Future[Any]] = [verified, wake]
            try:
                await asyncio.wait(either, timeout=LOOK_AGAIN_SECONDS, return_when=asyncio.FIRST_COMPLETED)
            finally:
                wake.cancel()

    def _follow(self) -> None:
        """Open the file the fetch writes now; a caller that was sent bytes
        of a file written again from its start is cut."""
        writer = self.arriving.writer
        if writer is None:
            return
        if writer is not self.writer or writer.rewrites != self.rewrites:
            if self.sent:
                raise self._rewritten()
            self.close()
            self.fd = _open_either(writer.tmp_path, self.arriving.stored_path, self.arriving.digest)
            self.writer, self.rewrites = writer, writer.rewrites

    def _rewritten(self) -> IntegrityError:
        return IntegrityError(f"blob sha256:{self.arriving.digest}: the upstream registry sent it again from the "
                              f"start while this answer was under way", subject=self.arriving.digest)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _open_either(staged: Path, stored: Path, digest: str) -> int:
    """The ingest file, or the blob's file in the store once it was committed."""
    for path in (staged, stored):
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
    raise IntegrityError(f"blob sha256:{digest} was discarded while this answer was under way", subject=digest)


__all__ = ["Arriving"]
