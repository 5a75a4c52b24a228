"""The daemon's check workers (server/checks/worker.py): processes that check big
JSON infer requests off the event loop and on as many cores as there are
workers, started on first use and stopped with the daemon.

A worker idle for IDLE_STOP seconds is stopped: it holds on to the memory
of the biggest request it parsed. A worker that fails or disappears
mid-task is killed and forgotten, and the request is checked in the daemon
instead (check returns None); a task cancelled mid-way (the client left)
kills its worker too, since its pipe is then in the middle of a message.
Workers that cannot start (START_FAILURES in a row) are not tried again
for REST_AFTER_FAILURES seconds: meanwhile the daemon checks requests itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import subprocess
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import TensorSpec
from cartonstore.system.child_stop import stop_child
from cartonstore.system.exit_notice import ExitNoticingProtocol
from cartonstore.system.pass_over import PassOver

from .request_check import Forward
from .worker import ANSWER_HEAD, TASK_HEAD

log = logging.getLogger("cartonstore.server")

STOP_GRACE = 2.0            # seconds a worker has to exit once its stdin is closed
IDLE_STOP = 60.0            # seconds a worker may sit idle before it is stopped
START_FAILURES = 3          # workers in a row that die before their first answer...
REST_AFTER_FAILURES = 60.0  # ...make the pool rest this long
READ_LIMIT = 1 << 20        # answers are read in megabytes, not 64 KiB at a time
WORKERS = "check workers"   # what the pool passes over after START_FAILURES


class WorkerFailed(Exception):
    """The worker could not answer: its reason, for the daemon's log."""


class CheckWorker:
    def __init__(self, transport: asyncio.SubprocessTransport, protocol: ExitNoticingProtocol) -> None:
        self.transport = transport
        self.protocol = protocol
        self.pid = transport.get_pid()
        self.idle_since = 0.0
        self.answered = 0

    @classmethod
    async def start(cls, command: Sequence[str]) -> CheckWorker:
        loop = asyncio.get_running_loop()
        # cwd "/": `python -m` puts the working directory first on sys.path,
        # and a numpy/ or cartonstore/ there must not be what the worker imports.
        transport, protocol = await loop.subprocess_exec(
            lambda: ExitNoticingProtocol(loop, READ_LIMIT), *command,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None, cwd="/",
            start_new_session=True)   # no preexec_fn: that would fork the whole daemon (the worker sets its PDEATHSIG)
        log.info("check worker started: pid %d", transport.get_pid())
        return cls(transport, protocol)

    async def run(self, meta: bytes, body: bytes | bytearray | memoryview) -> tuple[tuple, bytes]:
        """One task: the answer's meta and the bytes of its parts."""
        stdin, stdout = self.protocol.stdin, self.protocol.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(TASK_HEAD.pack(len(meta), len(body)) + meta)
            stdin.write(body)
            await stdin.drain()
            (size,) = ANSWER_HEAD.unpack(await stdout.readexactly(ANSWER_HEAD.size))
            out = pickle.loads(await stdout.readexactly(size))
            parts = await stdout.readexactly(sum(out[2])) if out[0] == "forward" else b""
        except (OSError, EOFError, asyncio.IncompleteReadError, pickle.UnpicklingError) as e:
            code = self.transport.get_returncode()
            gone = f"exited with status {code}" if code is not None else "broke the exchange"
            raise WorkerFailed(f"check worker pid {self.pid} {gone} ({type(e).__name__}: {e})") from None
        self.answered += 1
        return out, parts

    def _signal(self, sig: int) -> None:
        if self.transport.get_returncode() is None:
            try:
                os.killpg(self.pid, sig)   # its own session: nothing it started survives it
            except ProcessLookupError:
                pass

    async def reaped(self, grace: float = 0.0) -> None:
        """Wait for the exit (SIGKILL after ``grace``), then close the pipes.
        Not Process.wait(): on asyncio it also waits for end of file on
        stdout, which never comes while reading it is paused (a task
        cancelled halfway through a big answer)."""
        await stop_child(self._signal, self.protocol.exit_seen, grace, ask=None)
        self.transport.close()

    async def stop(self, grace: float) -> None:
        """Close its stdin (it exits at the end of its tasks), then reap it."""
        if self.protocol.stdin is not None:
            self.protocol.stdin.close()
        await self.reaped(grace)


WORKER_COMMAND = (sys.executable, "-m", "cartonstore.server.checks.worker")


class CheckPool:
    def __init__(self, size: int, *, idle_stop: float = IDLE_STOP, command: Sequence[str] = WORKER_COMMAND) -> None:
        self.size = size
        self.idle_stop = idle_stop
        self.command = tuple(command)   # the worker's argv (tests start stand-ins)
        self._free = asyncio.Semaphore(size)
        self._idle: list[CheckWorker] = []
        self._busy: set[CheckWorker] = set()
        self._reaping: set[asyncio.Task[None]] = set()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._start_failures = 0
        self._resting = PassOver(REST_AFTER_FAILURES)   # holds WORKERS while no worker is to be started
        self._closing: asyncio.Future[None] | None = None   # close()'s work, shared by every caller
        self.checked = 0     # requests checked by a worker
        self.failed = 0      # workers that failed mid-request

    @property
    def closed(self) -> bool:
        return self._closing is not None

    def stats(self) -> dict[str, int]:
        """For /metrics (read from a worker thread: each value alone)."""
        return {"workers": len(self._idle) + len(self._busy), "checked": self.checked, "failed": self.failed}

    async def check(self, inputs: Sequence[TensorSpec] | None, outputs: Sequence[TensorSpec] | None,
                    body: bytes | bytearray | memoryview) -> Forward | None:
        """What to forward for an all-JSON request naming no shared memory
        (InvalidInput for a bad one); None when a worker could not say (the
        caller checks it itself): it names shared memory, or the worker failed."""
        if self.closed or WORKERS in self._resting:
            return None   # closed: close() holds or waits for every slot
        meta = pickle.dumps((inputs, outputs))
        async with self._free:
            if self.closed:
                return None
            worker = self._idle.pop() if self._idle else None
            try:
                if worker is None:
                    worker = await CheckWorker.start(self.command)
                self._busy.add(worker)
                if self.closed:
                    raise WorkerFailed("the daemon is stopping")
                out, data = await worker.run(meta, body)
            except (OSError, subprocess.SubprocessError, WorkerFailed) as e:
                self._failed(worker, e)
                return None
            except BaseException:
                self._discard(worker)   # cancelled mid-message: its pipe is out of step
                raise
            self._start_failures = 0
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
            return [body], None
        if kind == "forward":
            view, parts, at = memoryview(data), [], 0
            for size in out[2]:
                parts.append(view[at:at + size])
                at += size
            return parts, out[1]
        if kind == "error":   # a bug the worker survived: the daemon's own check will say what it is
            log.warning("check worker pid %d could not check a request (%s); the daemon checks it itself",
                        worker.pid, out[1])
        return None   # "shm", "error"

    def _failed(self, worker: CheckWorker | None, error: BaseException) -> None:
        self._discard(worker)
        if self.closed:
            return
        self.failed += 1
        if worker is None or worker.answered == 0:
            self._start_failures += 1
        rest = self._start_failures >= START_FAILURES
        if rest:
            self._start_failures = 0
            self._resting.add(WORKERS)
        log.warning("check worker failed (%s); the daemon checks the request itself%s", error,
                    f"; no worker is tried for {REST_AFTER_FAILURES:.0f}s" if rest else "")

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
        self._reap(worker.reaped())

    def _reap(self, waiting: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(waiting)
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def close(self) -> None:
        """Stop every worker and reap it, a worker still starting too."""
        if self._closing is None:   # closed from here on: a check() arriving meanwhile starts no worker
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        idle, self._idle = self._idle, []
        for worker in list(self._busy):
            self._discard(worker)
        for worker in idle:
            self._reap(worker.stop(STOP_GRACE))
        # Every check under way ends soon: its worker is discarded above, or,
        # still starting, is discarded as it joins (the pool is closed). Their
        # slots, all taken, say they have: the last worker's reaping is then
        # among those awaited below.
        for _ in range(self.size):
            await self._free.acquire()
        while self._reaping:   # a task ending meanwhile may add one more
            await asyncio.gather(*self._reaping, return_exceptions=True)
