"""ModelRunners: the runner instances of one loaded model version, and
dispatch of requests among them.

A request goes to the READY instance with the fewest requests outstanding
(ties rotate); while none is ready because they restart, it waits for one
up to restart_wait (restart_wait.py), and one that never reached its
runner goes to the next. The model takes at most max_inflight requests at
once, waiting ones included; past that callers get RunnersBusy (503 +
Retry-After) at once rather than piling up behind a slow model.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cartonstore.config.runners import RunnerSettings
from cartonstore.errors import InvalidInput, Unavailable
from cartonstore.system.waiters import Broadcast
from cartonstore.v2.statistics import InferStatistics

from .instance import FirstProcess, RunnerInstance
from .process import RunnerFailed
from .restart_wait import RestartWait
from .settings import LOADING, READY, UNAVAILABLE, InstanceSpec, NotSent, RunnerResponse, RunnersBusy

if TYPE_CHECKING:
    from cartonstore.server.tensors.arena import TensorArena
    from cartonstore.server.tensors.arena_wire import ArenaForward
    from cartonstore.server.tensors.shm_regions import Region

log = logging.getLogger("cartonstore.server.runner_processes")

# Request headers that describe one hop, not the request; the client sets its own.
HOP_HEADERS = frozenset(h.lower() for h in (
    "Host", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Expect", "Upgrade", "TE",
    "Trailer", "Proxy-Authorization", "Proxy-Connection"))


class ModelRunners:
    """The supervised runners of model ``name`` version ``version``, one per
    spec. ``on_change`` is called (synchronously) whenever an instance changes
    state, restarts included."""

    def __init__(self, name: str, version: str, specs: list[InstanceSpec], settings: RunnerSettings, *,
                 on_change: Callable[[], None] | None = None, arena: TensorArena | None = None,
                 first_processes: Sequence[FirstProcess | None] = (), answer_limit: int = 256 << 20) -> None:
        """answer_limit: the most bytes one infer answer of this model may have."""
        if not specs:
            raise InvalidInput(f"model {name}: no runner instance to start")
        sockets = [s.socket_path for s in specs]
        if len(set(sockets)) != len(sockets):
            raise InvalidInput(f"model {name}: two runner instances share one socket path")
        self.name = name
        self.version = version
        self.settings = settings
        self.outstanding = 0
        self.statistics = InferStatistics()   # Triton's statistics of this version (v2/statistics.py)
        self._on_change = on_change
        self.arena = arena   # this version's own tensor arena (RunnerHost's), or None
        self.answer_limit = answer_limit
        firsts = list(first_processes) + [None] * (len(specs) - len(first_processes))
        self._instances = [RunnerInstance(name, i, spec, settings, self._changed, arena, firsts[i])
                           for i, spec in enumerate(specs)]
        self._next = 0                      # where the tie-break scan starts
        self._closing = False
        self._idle = asyncio.Event()        # set when outstanding drops to 0 while closing
        self._stopped = False
        self._starting: list[asyncio.Future[None]] = []
        self._stopping: asyncio.Future[None] | None = None
        self._state = Broadcast()             # each change of an instance's state, or the model's closing

    # -- status -------------------------------------------------------------

    def _changed(self) -> None:
        self._state.wake()
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:  # a metrics hook must not break supervision
                log.exception("on_change hook of model %s failed", self.name)

    @property
    def state(self) -> str:
        """READY when an instance is; LOADING while one is (re)starting;
        UNAVAILABLE when none will serve again."""
        states = {inst.state for inst in self._instances}
        if self._stopped or self._closing:
            return UNAVAILABLE
        if READY in states:
            return READY
        if LOADING in states:
            return LOADING
        return UNAVAILABLE

    @property
    def closing(self) -> bool:
        """Being unloaded (or unloaded): no new request is taken."""
        return self._closing or self._stopped

    @property
    def reason(self) -> str:
        """Why some instance does not serve (empty when all do)."""
        if self._stopped:
            return "unloaded"
        if self._closing:
            return "unloading"
        for inst in self._instances:
            if inst.state != READY:
                prefix = f"instance {inst.index}: " if len(self._instances) > 1 else ""
                return prefix + inst.reason
        return ""

    @property
    def arena_capable(self) -> bool:
        """Some instance maps the daemon's tensor arena: a big request may be received into it."""
        return any(inst.arena_capable for inst in self._instances)

    @property
    def decoupled(self) -> bool:
        """Its runners stream many responses to one request (protocol.py, section 12)."""
        return any(inst.decoupled for inst in self._instances)

    @property
    def restarts(self) -> int:
        return sum(inst.restarts for inst in self._instances)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "state": self.state, "reason": self.reason,
                "restarts": self.restarts, "outstanding": self.outstanding, "sandbox": self.sandbox,
                "instances": [inst.status() for inst in self._instances]}

    def memory_sources(self) -> list[tuple[int | None, Path | None]]:
        """Each instance's (pid, memory cgroup) for system/memory_use.py."""
        return [(inst.pid, inst.memory_cgroup) for inst in self._instances]

    @property
    def instances(self) -> tuple[RunnerInstance, ...]:
        return tuple(self._instances)

    @property
    def pids(self) -> list[int | None]:
        """Each instance's process id (None while it is not running), in order."""
        return [inst.pid for inst in self._instances]

    @property
    def devices(self) -> list[str]:
        """The device of each instance, in order."""
        return [inst.spec.device for inst in self._instances]

    @property
    def sandbox(self) -> str:
        """What the sandbox of its instances holds (the first instance's: all are alike)."""
        return self._instances[0].sandbox if self._instances else "none"

    # -- life ---------------------------------------------------------------

    async def start(self) -> None:
        """Start every instance and wait until each is ready. If one fails,
        all are stopped and InvalidInput says why (its exit status and last
        stderr lines, or that it was not ready in time)."""
        started = time.monotonic()
        tasks: list[asyncio.Future[None]] = [asyncio.ensure_future(inst.start()) for inst in self._instances]
        self._starting = tasks
        try:
            # wait, not gather: a task cancelled by stop() must not look like
            # our own cancellation.
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except BaseException:
            await self._abort(tasks)
            raise
        finally:
            self._starting = []
        for inst, task in zip(self._instances, tasks, strict=True):
            if not task.done() or task.cancelled() or task.exception() is None:
                continue
            error = task.exception()
            await self._abort(tasks)
            if isinstance(error, RunnerFailed):
                which = f" (instance {inst.index})" if len(self._instances) > 1 else ""
                raise InvalidInput(f"runner for {self.name}{which} failed to start: {error.reason}",
                                   subject=self.name, details={"stderr": error.stderr} if error.stderr else None)
            raise error  # type: ignore[misc]  # an exception: the test above
        if any(t.cancelled() for t in tasks) or self._closing:
            await self._abort(tasks)
            raise Unavailable(f"model {self.name} version {self.version} was unloaded while its runners started",
                              subject=self.name)
        log.info("model %s version %s: %d runner(s) ready in %.2fs", self.name, self.version,
                 len(self._instances), time.monotonic() - started)

    async def _abort(self, tasks: list[asyncio.Future[None]]) -> None:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._stop_instances(0.0)

    async def stop(self) -> None:
        """Refuse new requests, let those in flight finish (up to stop_grace),
        then stop every process (SIGTERM, SIGKILL after stop_grace), reap them
        and remove their sockets. Safe to call more than once, or at once."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        if self._stopped:
            return
        self._closing = True
        self._changed()
        if self.outstanding:
            try:
                await asyncio.wait_for(self._idle.wait(), self.settings.stop_grace)
            except asyncio.TimeoutError:
                log.warning("model %s: %d request(s) still in flight after %s s; stopping anyway",
                            self.name, self.outstanding, self.settings.stop_grace)
        await self._stop_instances(self.settings.stop_grace)

    async def _stop_instances(self, grace: float) -> None:
        self._closing = True
        for task in self._starting:
            task.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        await asyncio.gather(*(inst.stop(grace) for inst in self._instances))
        self._stopped = True
        self._changed()

    # -- requests -----------------------------------------------------------

    def pick(self) -> RunnerInstance | None:
        """The READY instance with the fewest outstanding requests; among
        equals, the scan starts one further each time so they take turns."""
        instances = self._instances
        count = len(instances)
        if count == 1:
            inst = instances[0]
            return inst if inst.state == READY else None
        best: RunnerInstance | None = None
        start = self._next
        for k in range(count):
            inst = instances[(start + k) % count]
            if inst.state == READY and (best is None or inst.outstanding < best.outstanding):
                best = inst
        if best is not None:
            self._next = (best.index + 1) % count
        return best

    async def forward(self, path: str, body: list[bytes | memoryview] | bytes | memoryview,
                      headers: Mapping[str, str], regions: Sequence[Region] = (),
                      arena: ArenaForward | None = None, *, answers: int = 1,
                      instance: RunnerInstance | None = None) -> RunnerResponse:
        """POST body to ``path`` (e.g. protocol.infer_path(name)) on a runner
        (which maps the shared memory ``regions`` first) and return its
        answer, whatever its status. Raises RunnersBusy when the model is at
        max_inflight, Unavailable when no runner can answer, BadUpstream
        when its answer is over ``answers`` (a batch's requests) times the
        model's answer_limit. With ``arena``, an instance that maps the arena
        gets the request in its form. ``instance``: sent there alone (a
        sequence's), never waited for or sent elsewhere."""
        self._admit()
        send = {k: v for k, v in headers.items() if k.lower() not in HOP_HEADERS}
        parts = [body] if isinstance(body, (bytes, bytearray, memoryview)) else body
        self.outstanding += 1   # a request waiting for a runner counts too
        try:
            if instance is not None:
                return await self._forward_on(instance, path, parts, send, regions, arena, answers)
            waits = RestartWait(self, self.settings.restart_wait)
            while True:
                inst = await waits.ready_instance()
                try:
                    return await inst.post(path, parts, send, regions, arena, limit=answers * self.answer_limit)
                except NotSent as e:
                    await waits.after_unsent(inst, str(e))
        finally:
            self.outstanding -= 1
            if self._closing and not self.outstanding:
                self._idle.set()

    async def _forward_on(self, inst: RunnerInstance, path: str, parts: list[bytes | memoryview],
                          send: Mapping[str, str], regions: Sequence[Region], arena: ArenaForward | None,
                          answers: int) -> RunnerResponse:
        if inst.state != READY:
            raise Unavailable(f"{inst.label} is {inst.state.lower()}: {inst.reason}", subject=self.name)
        try:
            return await inst.post(path, parts, send, regions, arena, limit=answers * self.answer_limit)
        except NotSent as e:
            raise Unavailable(f"{inst.label} did not take the request: {e}", subject=self.name) from e

    def _admit(self) -> None:
        """A new request may come in: Unavailable while the model unloads,
        RunnersBusy at max_inflight (waiting requests count)."""
        if self._closing:
            raise self.unloading()
        if self.outstanding >= self.settings.max_inflight:
            raise RunnersBusy(f"model {self.name} already has {self.outstanding} requests in flight "
                              f"(max_inflight {self.settings.max_inflight}); retry later", subject=self.name)

    def unloading(self) -> Unavailable:
        return Unavailable(f"model {self.name} version {self.version} is being unloaded", subject=self.name)

    def state_changed(self) -> asyncio.Event:
        """An event set at the next change of an instance's state (or the model's closing)."""
        return self._state.next()

    async def forward_stream(self, path: str, body: list[bytes | memoryview], headers: Mapping[str, str],
                             regions: Sequence[Region] = ()) -> AsyncGenerator[RunnerResponse, None]:
        """forward's stream: each response a decoupled model's runner sends
        to one request, read as the caller takes them (each at most the
        model's answer_limit). It waits for a ready instance as forward
        does; a stream is not sent again once its instance was picked."""
        self._admit()
        send = {k: v for k, v in headers.items() if k.lower() not in HOP_HEADERS}
        self.outstanding += 1
        try:
            inst = await RestartWait(self, self.settings.restart_wait).ready_instance()
            async with aclosing(inst.stream(path, body, send, regions, limit=self.answer_limit)) as responses:
                async for response in responses:
                    yield response
        finally:
            self.outstanding -= 1
            if self._closing and not self.outstanding:
                self._idle.set()
