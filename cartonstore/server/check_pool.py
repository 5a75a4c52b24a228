"""The daemon's check workers (check_worker.py): processes that check big
JSON infer requests off the event loop and on as many cores as there are
workers, started on first use and stopped with the daemon.

A worker idle for IDLE_STOP seconds is stopped: it holds on to the memory
of the biggest request it parsed. A worker that fails or disappears
mid-task is killed and forgotten, and
the request is checked in the daemon instead (check returns None); a task
cancelled mid-way (the client left) kills its worker too, since its pipe
is then in the middle of a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from ..errors import InvalidInput
from ..format.carton_toml import TensorSpec
from .check_worker import ANSWER_HEAD, TASK_HEAD
from .infer_check import Forward
from .runners.process import die_with

log = logging.getLogger("cartonstore.server")

STOP_GRACE = 2.0         # seconds a worker has to exit once its stdin is closed
IDLE_STOP = 60.0         # seconds a worker may sit idle before it is stopped


def default_size() -> int:
    """One worker per core, at most 8: each holds a request's parsed JSON
    (tens of MiB for a million values) while it works."""
    return max(1, min(8, os.cpu_count() or 1))


class CheckWorker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.idle_since = 0.0

    @classmethod
    async def start(cls) -> CheckWorker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cartonstore.server.check_worker", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, start_new_session=True, preexec_fn=die_with(os.getpid()))
        log.info("check worker started: pid %d", proc.pid)
        return cls(proc)

    async def run(self, meta: bytes, body: bytes | bytearray | memoryview) -> tuple[tuple, bytes]:
        """One task: the answer's meta and the bytes of its parts."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(TASK_HEAD.pack(len(meta), len(body)) + meta)
        stdin.write(body)
        await stdin.drain()
        (size,) = ANSWER_HEAD.unpack(await stdout.readexactly(ANSWER_HEAD.size))
        out = pickle.loads(await stdout.readexactly(size))
        parts = await stdout.readexactly(sum(out[2])) if out[0] == "forward" else b""
        return out, parts

    async def stop(self, grace: float) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), grace)
        except asyncio.TimeoutError:
            self.kill()
            await self.proc.wait()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


class CheckPool:
    def __init__(self, size: int, *, idle_stop: float = IDLE_STOP) -> None:
        self.size = size
        self.idle_stop = idle_stop
        self._idle_timer: asyncio.TimerHandle | None = None
        self._free = asyncio.Semaphore(size)
        self._idle: list[CheckWorker] = []
        self._busy: set[CheckWorker] = set()
        self._reaping: set[asyncio.Task[None]] = set()
        self.closed = False
        self.checked = 0     # requests checked by a worker
        self.failed = 0      # workers that failed mid-request

    def stats(self) -> dict[str, int]:
        """For /metrics (read from a worker thread: each value alone)."""
        return {"workers": len(self._idle) + len(self._busy), "checked": self.checked, "failed": self.failed}

    async def check(self, inputs: Sequence[TensorSpec] | None, outputs: Sequence[TensorSpec] | None,
                    body: bytes | bytearray | memoryview, header_length: int | None) -> Forward | None:
        """What to forward for a request naming no shared memory (InvalidInput
        for a bad one); None when a worker could not say (the caller checks
        it itself): it names shared memory, or the worker failed."""
        meta = pickle.dumps((inputs, outputs, header_length))
        async with self._free:
            if self.closed:
                return None
            worker = self._idle.pop() if self._idle else None
            try:
                if worker is None:
                    worker = await CheckWorker.start()
                self._busy.add(worker)
                out, data = await worker.run(meta, body)
            except (OSError, EOFError, asyncio.IncompleteReadError, pickle.UnpicklingError) as e:
                log.warning("check worker failed (%s: %s); the daemon checks the request itself",
                            type(e).__name__, e)
                self.failed += 1
                self._discard(worker)
                return None
            except BaseException:
                self._discard(worker)   # cancelled mid-message: its pipe is out of step
                raise
            self._busy.discard(worker)
            if self.closed:
                self._discard(worker)
            else:
                self._rest(worker)
        self.checked += 1
        kind = out[0]
        if kind == "invalid":
            raise InvalidInput(out[1], subject=out[2])
        if kind == "as_is":
            return [body], out[1]
        if kind == "forward":
            view, parts, at = memoryview(data), [], 0
            for size in out[2]:
                parts.append(view[at:at + size])
                at += size
            return parts, out[1]
        return None   # "shm"

    def _rest(self, worker: CheckWorker) -> None:
        loop = asyncio.get_running_loop()
        worker.idle_since = loop.time()
        self._idle.append(worker)
        if self._idle_timer is None:
            self._idle_timer = loop.call_later(self.idle_stop, self._stop_idle)

    def _stop_idle(self) -> None:
        """Stop the workers idle for idle_stop; look again when the next one will have been."""
        self._idle_timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        stale = [w for w in self._idle if now - w.idle_since >= self.idle_stop]
        self._idle = [w for w in self._idle if w not in stale]
        for worker in stale:
            self._reap(worker.stop(STOP_GRACE))
        if self._idle:
            wait = min(w.idle_since for w in self._idle) + self.idle_stop - now
            self._idle_timer = loop.call_later(max(wait, 0.0), self._stop_idle)

    def _discard(self, worker: CheckWorker | None) -> None:
        if worker is None:
            return
        self._busy.discard(worker)
        worker.kill()
        self._reap(worker.proc.wait())

    def _reap(self, waiting: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(waiting)
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def close(self) -> None:
        """Stop every worker and reap it."""
        self.closed = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        idle, self._idle = self._idle, []
        for worker in list(self._busy):
            self._discard(worker)
        await asyncio.gather(*(w.stop(STOP_GRACE) for w in idle), *self._reaping, return_exceptions=True)
