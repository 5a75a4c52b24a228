"""Cross-process locks on files under ROOT/locks/ (flock: released by the
kernel when a process dies, so a SIGKILL never leaves a store locked)."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from cartonstore.errors import Unavailable

# A waiter polls (flock has no timeout), first often, then every 10 ms: gc
# takes the store lock for a couple of milliseconds at a time and should not
# lose a whole poll interval to each short wait.
_POLL_FIRST_SECONDS = 0.0005
_POLL_MAX_SECONDS = 0.01


def _open_lock_file(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o664)
    except OSError as e:
        raise Unavailable(f"cannot open lock file {path}: {e.strerror.lower() if e.strerror else e}",
                          subject=str(path)) from e


class FileLock:
    """An flock on one file; shared (readers) or exclusive (writers).

    acquire() raises Unavailable after ``timeout`` seconds, naming the lock.
    Not re-entrant. Usable as a context manager.
    """

    def __init__(self, path: Path, *, shared: bool = False, timeout: float = 600.0) -> None:
        self.path = path
        self.shared = shared
        self.timeout = timeout
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = _open_lock_file(self.path)
        mode = (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        deadline = time.monotonic() + self.timeout
        poll = _POLL_FIRST_SECONDS
        while True:
            try:
                fcntl.flock(fd, mode)
                self._fd = fd
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise Unavailable(
                        f"timed out after {self.timeout:g}s waiting for lock {self.path}",
                        subject=str(self.path),
                    ) from None
                time.sleep(poll)
                poll = min(poll * 2, _POLL_MAX_SECONDS)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class HeldLock:
    """A FileLock whose file stays open, taken and dropped with one flock call
    each: for a hot path (every lease) that must not interleave with gc."""

    def __init__(self, lock: FileLock) -> None:
        self._fd = _open_lock_file(lock.path)
        self._mode = fcntl.LOCK_SH if lock.shared else fcntl.LOCK_EX

    def __enter__(self) -> HeldLock:
        fcntl.flock(self._fd, self._mode)
        return self

    def try_acquire(self) -> bool:
        """Take it only if that needs no wait."""
        try:
            fcntl.flock(self._fd, self._mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


@asynccontextmanager
async def async_file_lock(path: Path, *, timeout: float, poll: float = 0.05) -> AsyncIterator[None]:
    """An exclusive flock waited for without blocking the event loop."""
    import asyncio  # imported here: the store's blocking users (path, ls) never load it

    fd = _open_lock_file(path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Unavailable(f"timed out after {timeout:g}s waiting for lock {path}",
                                      subject=str(path)) from None
                await asyncio.sleep(poll)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
