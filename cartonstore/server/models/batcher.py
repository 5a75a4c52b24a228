"""Dynamic batching, as Triton's dynamic_batching does it, in the daemon:
so every runner gets it, third-party ones included.

Validated requests for a model version wait here, grouped by what they
ask (v2/batching.batch_key: the same inputs but for their rows, the same
parameters, the same outputs). A group is sent as one request, its rows
joined along the first dimension, when a runner instance is free and the
group is full (max_batch_size rows), reaches a preferred batch size, or
its oldest request has waited max_queue_delay; the answer is cut back
into each request's rows and framed as each asked. At most one batch per
instance runs at once: while they are busy, requests gather, which is
where batching comes from when the delay is 0.

A request is never split; a request that is cancelled while it waits
leaves the queue; the queue holds at most runners.max_inflight requests
(RunnersBusy beyond, as for an unbatched model).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from cartonstore.errors import BadUpstream
from cartonstore.runner.protocol import infer_path
from cartonstore.server.runner_processes import ModelRunners
from cartonstore.server.runner_processes.settings import RunnerResponse, RunnersBusy
from cartonstore.v2.batching import answers_for, batch_key, joined_request, rows
from cartonstore.v2.binary_form import body_headers
from cartonstore.v2.framing import HEADER_LENGTH, parse_infer_response
from cartonstore.v2.statistics import RequestTiming
from cartonstore.v2.wire_types import InferRequest

from .model_config import BatchingPolicy

log = logging.getLogger("cartonstore.batcher")
IN_THREAD_FROM = 1 << 20   # joining or cutting more bytes than this runs in a thread


@dataclass(eq=False)   # compared by identity: a request's tensors are not walked to find it
class _Waiting:
    req: InferRequest
    rows: int
    alone: tuple[list[Any], dict[str, str]]   # the request as it is sent in a batch of its own
    arrived: int = field(default_factory=time.monotonic_ns)
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class DynamicBatcher:
    def __init__(self, runners: ModelRunners, policy: BatchingPolicy, *, instances: int, max_queued: int) -> None:
        self._runners = runners
        self._path = infer_path(runners.name)
        self._policy = policy
        self._slots = max(1, instances)
        self._max_queued = max_queued
        self._busy = 0
        self._queued = 0
        self._groups: dict[tuple, list[_Waiting]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self._draining = False

    async def drain(self) -> None:
        """Before its runners stop (an unload, a version switch): send what
        waits at once, and wait for every batch to be answered."""
        self._draining = True
        while self._groups or self._tasks:
            if self._groups:
                self._pump()
            if self._tasks:
                await asyncio.wait(set(self._tasks))
            else:
                await asyncio.sleep(0)

    async def submit(self, req: InferRequest, parts: list[Any], headers: dict[str, str]) -> RunnerResponse:
        """Run validated ``req`` as part of a batch; its answer, as its runner
        would have given it (the execution is counted here). ``parts`` and
        ``headers``: the request as it goes to the runner unbatched (what it
        is sent as in a batch of one)."""
        if self._queued >= self._max_queued:
            raise RunnersBusy(f"model {self._runners.name} already has {self._queued} requests waiting to be "
                              f"batched (runners.max_inflight {self._max_queued}); retry later",
                              subject=self._runners.name)
        waiting = _Waiting(req, rows(req), (parts, headers))
        key = batch_key(req)
        self._groups.setdefault(key, []).append(waiting)
        self._queued += 1
        self._pump()
        try:
            return await waiting.future
        except asyncio.CancelledError:
            group = self._groups.get(key)
            if group is not None and waiting in group:   # still waiting: it leaves the queue
                group.remove(waiting)
                self._queued -= 1
                if not group:
                    del self._groups[key]
                self._pump()   # what is left may be ready now (a preferred size)
            raise

    def _pump(self) -> None:
        """Send every batch that is ready while instances are free; else
        wake up when the oldest waiting request's delay is over."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = time.monotonic_ns()
        delay = self._policy.max_queue_delay_us * 1000
        while self._busy < self._slots and self._groups:
            ready = None
            for key, group in sorted(self._groups.items(), key=lambda kv: kv[1][0].arrived):
                count = self._batch_of(group, self._draining or now >= group[0].arrived + delay)
                if count:
                    ready = key, count
                    break
            if ready is None:
                due = min(group[0].arrived for group in self._groups.values()) + delay
                loop = asyncio.get_running_loop()
                self._timer = loop.call_at(loop.time() + max(0, due - now) / 1e9, self._pump)
                return
            key, count = ready
            group = self._groups[key]
            batch, self._groups[key] = group[:count], group[count:]
            if not self._groups[key]:
                del self._groups[key]
            self._queued -= count
            self._busy += 1
            task = asyncio.create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _batch_of(self, group: list[_Waiting], due: bool) -> int:
        """How many of ``group``'s first requests to send now (0: wait):
        as many as fit max_batch_size when that is full, more are waiting,
        or the delay is over; the largest preferred size that a run of
        them makes up exactly, else."""
        limit, fitted, total, preferred_count = self._policy.max_batch_size, 0, 0, 0
        for waiting in group:
            if total + waiting.rows > limit:
                return fitted   # full as it can be: more are waiting
            total += waiting.rows
            fitted += 1
            if total in self._policy.preferred:
                preferred_count = fitted
        if total == limit or due:
            return fitted
        return preferred_count

    async def _run(self, batch: list[_Waiting]) -> None:
        try:
            answers = await self._execute(batch)
        except Exception as e:  # noqa: BLE001 - every waiting request gets the failure, whatever it is
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(e)
        except BaseException:   # cancelled (the daemon stopping): so are they
            for waiting in batch:
                waiting.future.cancel()
            raise
        else:
            for waiting, answer in zip(batch, answers, strict=True):
                if not waiting.future.done():
                    waiting.future.set_result(answer)
        finally:
            self._busy -= 1
            self._pump()

    async def _execute(self, batch: list[_Waiting]) -> list[RunnerResponse]:
        reqs = [w.req for w in batch]
        size = sum(w.rows for w in batch)
        if len(batch) == 1:
            parts, headers = batch[0].alone
        elif sum(len(p) for w in batch for p in w.alone[0]) >= IN_THREAD_FROM:
            parts, header_length = await asyncio.to_thread(joined_request, reqs)
        else:
            parts, header_length = joined_request(reqs)
        if len(batch) > 1:
            headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(header_length)}
        sent = time.monotonic_ns()
        response = await self._runners.forward(self._path, parts, headers, answers=len(batch))
        ran = time.monotonic_ns() - sent
        if response.status == 200:   # counted here, once, whatever becomes of the requests in it
            inside = response.timing.believed(ran) if response.timing is not None else None
            self._runners.statistics.record_execution(size, inside or RequestTiming(0, 0, ran, 0))
        if response.status != 200 or len(batch) == 1:   # an error is every request's; one alone is as it came
            return [_timed(response, w, sent, ran, response.timing) for w in batch]
        body, length = response.body, response.headers.get(HEADER_LENGTH)
        try:
            if len(body) >= IN_THREAD_FROM:
                shares = await asyncio.to_thread(_cut, reqs, body, length, self._runners.name)
            else:
                shares = _cut(reqs, body, length, self._runners.name)
        except Exception as e:  # noqa: BLE001 - the runner's answer, not the clients' requests, is at fault
            log.warning("model %s: a batched answer could not be cut back: %s", self._runners.name, e)
            raise BadUpstream(f"runner for {self._runners.name} answered a batch of {len(batch)} requests "
                              f"with what cannot be cut back into their answers (dynamic batching: {e})",
                              subject=self._runners.name) from None
        return [_timed(RunnerResponse(200, headers, b"".join(parts)), w, sent, ran, response.timing)
                for w, (parts, headers) in zip(batch, shares, strict=True)]


def _cut(reqs: list[InferRequest], body: bytes | bytearray | memoryview, length: str | None,
         model_name: str) -> list[tuple[list[Any], dict[str, str]]]:
    doc, arrays = parse_infer_response(body, int(length) if length else None)
    out = []
    for parts, header_length in answers_for(reqs, doc, arrays, model_name):
        out.append((parts, body_headers(header_length)))
    return out


def _timed(response: RunnerResponse, waiting: _Waiting, sent: int, ran: int,
           inside: RequestTiming | None = None) -> RunnerResponse:
    """The response with its request's timing: the time it waited here
    added to the runner's queue time (or, from a runner that does not say,
    the call's whole time as the model's)."""
    waited = sent - waiting.arrived
    timing = RequestTiming(waited, 0, ran, 0) if inside is None else \
        RequestTiming(inside.queue_ns + waited, inside.input_ns, inside.infer_ns, inside.output_ns)
    return RunnerResponse(response.status, dict(response.headers), response.body, timing=timing)
