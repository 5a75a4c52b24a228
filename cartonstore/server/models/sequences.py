"""Triton's sequence batcher, direct strategy, over a model's runners: the
requests of one sequence (one ``sequence_id``) all go to the instance its
first request (``sequence_start``) was given, one at a time, in the order
they came, each with the control inputs its config names filled (START on
the first, END on the last, READY on each, CORRID its id). An instance
holds max(1, max_batch_size) sequences at once; a new sequence waits for a
slot up to runners.restart_wait, then is refused naming the sequences
holding them. A sequence ends with its ``sequence_end`` request, or when
idle past max_sequence_idle_microseconds; a later request with its id and
no START is refused, naming it. A sequence whose instance restarted lost
the state its model kept: its next request fails, naming that, and is
never sent to another instance where the state is not.

Requests of different sequences are sent as they come, not joined into
one batch: each carries a batch of one (controls shaped [1, 1] for a model
with max_batch_size, else [1])."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cartonstore.errors import InvalidInput, Unavailable
from cartonstore.runner.protocol import infer_path
from cartonstore.server.runner_processes import ModelRunners
from cartonstore.server.runner_processes.answer_check import IN_THREAD_FROM
from cartonstore.server.runner_processes.settings import READY, RunnerResponse, RunnersBusy
from cartonstore.system.waiters import Broadcast, within
from cartonstore.v2.binary_form import body_headers, with_inputs
from cartonstore.v2.wire_types import InferRequest

from .sequence_config import CORRID, END, START, SequencePolicy

if TYPE_CHECKING:
    from cartonstore.server.runner_processes.instance import RunnerInstance
    from cartonstore.server.tensors.shm_regions import Region

log = logging.getLogger("cartonstore.server.models")

SequenceId = int | str
_REMEMBERED = 4096   # ended sequences whose end a refusal can still name


@dataclass(eq=False)
class _Sequence:
    id: SequenceId
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    instance: RunnerInstance | None = None
    restarts: int = 0          # the instance's restarts when the sequence started on it
    last: float = field(default_factory=time.monotonic)
    queued: int = 0            # its requests in or waiting for the lock
    ended: bool = False


class SequenceRouter:
    """The sequences of one loaded model version (model ``name``)."""

    def __init__(self, name: str, runners: ModelRunners, policy: SequencePolicy, max_batch_size: int) -> None:
        if runners.decoupled:
            raise InvalidInput(f"config: sequence_batching: cartonstore does not serve a decoupled model (one "
                               f"that streams many responses to a request) with sequence batching; model {name!r} "
                               f"is one", subject="sequence_batching")
        self.name = name
        self.runners = runners
        self.policy = policy
        self.batched = max_batch_size > 0
        self.per_instance = max(1, max_batch_size)
        self._active: dict[SequenceId, _Sequence] = {}
        self._ended: OrderedDict[SequenceId, str] = OrderedDict()   # id -> why it ended
        self._held: dict[int, int] = {}        # instance index -> sequences on it
        self._freed = Broadcast()              # each slot freed
        self._expiry = asyncio.ensure_future(self._expire_idle())

    def flags(self, req: InferRequest) -> tuple[SequenceId, bool, bool]:
        """The request's sequence id, start and end flags, refused as
        Triton refuses them (no id; an id of the wrong kind for CORRID)
        and when it sends a control input itself."""
        params = req.parameters
        seq_id = params.get("sequence_id")
        if isinstance(seq_id, bool) or not isinstance(seq_id, (int, str)) or seq_id in (0, ""):
            raise InvalidInput(f"inference request to model {self.name!r} must specify a non-zero or non-empty "
                               f"correlation ID (parameter 'sequence_id'): it has sequence batching",
                               subject="sequence_id")
        corrid = self.policy.corrid_type
        if corrid is not None and isinstance(seq_id, str) != (corrid == "BYTES"):
            wanted = "a string" if corrid == "BYTES" else "an unsigned integer"
            raise InvalidInput(f"inference request to model {self.name!r}: sequence_id {seq_id!r} must be {wanted} "
                               f"(its CORRID control input is {corrid})", subject="sequence_id")
        if isinstance(seq_id, int) and not 0 < seq_id < 1 << 64:
            raise InvalidInput(f"inference request to model {self.name!r}: sequence_id {seq_id} is outside "
                               f"[1, 2^64)", subject="sequence_id")
        for key in ("sequence_start", "sequence_end"):
            if not isinstance(params.get(key, False), bool):
                raise InvalidInput(f"inference request: parameter {key!r} must be a boolean, not "
                                   f"{params[key]!r}", subject=key)
        for tensor in req.inputs:
            if tensor.name in self.policy.names:
                raise InvalidInput(f"input {tensor.name!r} is a control input of model {self.name!r}'s sequence "
                                   f"batching: the daemon sets it", subject=tensor.name)
        return seq_id, bool(params.get("sequence_start", False)), bool(params.get("sequence_end", False))

    async def forward(self, req: InferRequest, parts: list[Any], header_length: int | None,
                      regions: Sequence[Region] = ()) -> RunnerResponse:
        """Send ``req`` (checked; ``parts`` its body as a runner takes it)
        in its sequence's turn, on its sequence's instance; the runner's
        answer, whatever its status."""
        seq_id, start, end = self.flags(req)
        while True:
            seq = self._active.get(seq_id)
            if seq is None:
                if not start:
                    raise self._needs_start(seq_id)
                seq = self._active[seq_id] = _Sequence(seq_id)
                self._ended.pop(seq_id, None)
            seq.queued += 1
            try:
                async with seq.lock:
                    if seq.ended:   # it ended while this request waited its turn
                        continue
                    return await self._sent(seq, start, end, req, parts, header_length, regions)
            finally:
                seq.queued -= 1
                seq.last = time.monotonic()

    async def _sent(self, seq: _Sequence, start: bool, end: bool, req: InferRequest, parts: list[Any],
                    header_length: int | None, regions: Sequence[Region]) -> RunnerResponse:
        if start:
            if seq.instance is None or self._lost(seq) is not None:
                self._free(seq)
                try:
                    seq.instance = await self._slot(seq.id)
                except BaseException:
                    self._end(seq, "it found no slot")
                    raise
            seq.restarts = seq.instance.restarts
        else:
            lost = self._lost(seq)
            if lost is not None:
                self._end(seq, lost)
                raise Unavailable(f"sequence {seq.id!r} of model {self.name!r} lost its state: {lost}; send it "
                                  f"again from its START", subject="sequence_id")
        assert seq.instance is not None
        controls = self._controls(seq.id, start, end)
        if controls:   # an all-JSON body is parsed again whole: a big one in a thread
            big = header_length is None and sum(memoryview(p).nbytes for p in parts) >= IN_THREAD_FROM
            parts, header_length = await asyncio.to_thread(with_inputs, parts, header_length, controls) if big \
                else with_inputs(parts, header_length, controls)
        try:
            return await self.runners.forward(infer_path(self.name), parts, body_headers(header_length), regions,
                                              instance=seq.instance)
        finally:
            if end:
                self._end(seq, "its END request came")

    def _lost(self, seq: _Sequence) -> str | None:
        """Why the state a sequence's model kept is gone, None if it is not."""
        inst = seq.instance
        if inst is None:
            return "it has no instance"
        if inst.restarts != seq.restarts:
            return f"{inst.label} restarted since the sequence started"
        if inst.state != READY:
            return f"{inst.label} is {inst.state.lower()} ({inst.reason})"
        return None

    def _controls(self, seq_id: SequenceId, start: bool, end: bool) -> list[dict[str, Any]]:
        shape = [1, 1] if self.batched else [1]
        entries = []
        for control in self.policy.controls:
            if control.kind == CORRID:
                value: Any = seq_id
            else:
                on = start if control.kind == START else end if control.kind == END else True
                value = control.true if on else control.false
            entries.append({"name": control.name, "datatype": control.datatype, "shape": shape, "data": [value]})
        return entries

    async def _slot(self, seq_id: SequenceId) -> RunnerInstance:
        """A READY instance with a free slot, the least held first, taken;
        waits for one up to runners.restart_wait."""
        wait = self.runners.settings.restart_wait
        deadline = time.monotonic() + wait
        while True:
            free = [inst for inst in self.runners.instances
                    if inst.state == READY and self._held.get(inst.index, 0) < self.per_instance]
            if free:
                inst = min(free, key=lambda i: self._held.get(i.index, 0))
                self._held[inst.index] = self._held.get(inst.index, 0) + 1
                return inst
            if self.runners.closing:
                raise self.runners.unloading()
            left = deadline - time.monotonic()
            if left <= 0:
                holders = ", ".join(repr(s.id) for s in list(self._active.values())[:8] if s.instance is not None)
                raise RunnersBusy(f"model {self.name!r}: sequence {seq_id!r} found every sequence slot held after "
                                  f"waiting runners.restart_wait {wait:g}s ({self.per_instance} per instance, "
                                  f"held by sequence(s) {holders or 'none'}; an instance may be restarting)",
                                  subject=self.name)
            waiters = [asyncio.ensure_future(e.wait()) for e in (self._freed.next(), self.runners.state_changed())]
            try:
                await asyncio.wait(waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()

    def _needs_start(self, seq_id: SequenceId) -> InvalidInput:
        why = self._ended.get(seq_id)
        return InvalidInput(f"inference request for sequence {seq_id!r} to model {self.name!r} must specify the "
                            f"START flag on the first request of the sequence (parameter 'sequence_start')"
                            + (f"; the sequence ended: {why}" if why else ""), subject="sequence_id")

    def _end(self, seq: _Sequence, why: str) -> None:
        if seq.ended:
            return
        seq.ended = True
        self._free(seq)
        if self._active.get(seq.id) is seq:
            del self._active[seq.id]
        self._ended[seq.id] = why
        while len(self._ended) > _REMEMBERED:
            self._ended.popitem(last=False)

    def _free(self, seq: _Sequence) -> None:
        if seq.instance is None:
            return
        self._held[seq.instance.index] -= 1
        seq.instance = None
        self._freed.wake()

    async def _expire_idle(self) -> None:
        """End each sequence with no request for max_sequence_idle, until the runners stop."""
        idle = self.policy.idle_us / 1e6
        tick = min(max(idle / 4, 0.01), 1.0)
        while not self.runners.closing:
            now = time.monotonic()
            for seq in list(self._active.values()):
                if not seq.queued and now - seq.last >= idle:
                    log.info("model %s: sequence %r idle for %.3gs: ended", self.name, seq.id, now - seq.last)
                    self._end(seq, f"no request for max_sequence_idle_microseconds {self.policy.idle_us}")
            try:
                await within(self.runners.state_changed().wait(), tick)
            except TimeoutError:
                pass
