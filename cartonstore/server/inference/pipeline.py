"""The one inference path every door calls: the model resolved again after
its request arrived (a version may have switched), the request checked,
batched or given an instance (a runner, maybe through the arena), the
runner's answer checked and shaped for the door, the model version's
statistics counted.

A door hands an InferCall: over HTTP the decoded body as it came (no
binary tensor is decoded or copied on the way; a raw binary request gets a
JSON header here, so runners only ever see the framed form; JSON "data"
inputs, already parsed and checked, are sent on as binary tensor data,
v2/binary_form.py), over gRPC the request it parsed from its message
(v2/grpc_form.py). Back comes an InferAnswer: the bytes an HTTP client
gets (maybe compressed), or for a parsed request the runner's outputs,
parsed once, that the door turns into its own message. Failures are
CartonStoreErrors; a runner's error answer is an InferAnswer of its
status, which a door that has no such answer raises as a StatusError.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cartonstore.errors import InvalidInput
from cartonstore.runner.protocol import ARENA_REGION, infer_path
from cartonstore.server.calls.bodies import ENCODINGS, IN_THREAD_FROM, pick_encoding
from cartonstore.server.models.response_cache import CachedAnswer, cached_answer_off_loop, request_key_off_loop
from cartonstore.server.runner_processes.answer_check import (
    ParsedAnswer,
    checked_answer_off_loop,
)
from cartonstore.server.tensors.arena import ArenaSlot
from cartonstore.server.tensors.arena_wire import MAX_HEADER, ArenaForward
from cartonstore.server.tensors.infer_shm import ShmUse, renamed_answer
from cartonstore.server.tensors.shm_regions import Peer
from cartonstore.v2.binary_form import body_headers, runner_doc
from cartonstore.v2.encode import encode_answer_tensors
from cartonstore.v2.error_body import error_text
from cartonstore.v2.framing import InferRequest
from cartonstore.v2.framing import header_length as header_length_of
from cartonstore.v2.shared_memory import REGION, with_region
from cartonstore.v2.wire_types import WireTensor

from .answer import InferAnswer
from .checks import Checked, batch_size, checked_off_loop, tensors_checked_off_loop
from .models import serving_on_demand, still_serving
from .phases import Phases

if TYPE_CHECKING:
    from cartonstore.server.models.loaded_model import LoadedModel
    from cartonstore.server.models.service import ModelService

_SMALL_ANSWER = 512   # answers no larger go uncompressed


@dataclass(slots=True)
class InferCall:
    """One infer request as a door hands it to the core."""

    name: str
    version: str | None
    peer: Peer
    body: bytes | bytearray | memoryview = b""   # HTTP: the decoded body, as it came
    header_length: str | None = None   # HTTP: its Inference-Header-Content-Length, as sent
    accept_encoding: str = ""
    slot: ArenaSlot | None = None   # the arena slot the body (a parsed request's data) was received into
    request: InferRequest | None = None   # parsed by the door (gRPC): its data follow in order, not in body

    @property
    def parsed(self) -> bool:
        return self.request is not None


async def infer(service: ModelService, model: LoadedModel | None, call: InferCall,
                convert: Callable[[InferAnswer], Any] | None = None) -> InferAnswer:
    """Check ``call`` against ``model`` and run it; the runner's answer.
    ``model`` None: the door found it not loaded and it loads on demand
    (serving_or_loadable), waited for here.
    ``call.slot``: the caller releases it once the answer is written (or
    converted). ``convert``: turns a successful answer into a door's own
    form (``answer.converted``); if it raises, the request failed. Every
    request that reached a model's check counts in its statistics."""
    service.turnover.request_started(call.name)   # in flight: its model is not unloaded for being idle
    try:
        if model is None:
            model = await serving_on_demand(service, call.name, call.version)
        return await _answered(service, model, call, convert)
    finally:
        service.turnover.request_ended(call.name)


async def _answered(service: ModelService, model: LoadedModel, call: InferCall,
                    convert: Callable[[InferAnswer], Any] | None) -> InferAnswer:
    phases = Phases()
    try:
        answer = await _run(service, model, call, phases)
        if convert is not None and answer.status < 400:
            answer.converted = convert(answer)
    except BaseException:
        phases.record(model, False)
        raise
    phases.record(model, answer.status < 400)
    return answer


async def checked_call(service: ModelService, model: LoadedModel, call: InferCall) -> Checked:
    """``call`` checked against ``model``: the request and what goes to its runner."""
    header_length = None if call.parsed else header_length_of(call.header_length)  # 0: a raw binary request
    shm = (service.shm_regions, call.peer)
    if call.request is not None:
        return await tensors_checked_off_loop(model, call.request, shm)
    return await checked_off_loop(model, call.body, header_length, shm, service.check_pool)


async def _run(service: ModelService, model: LoadedModel, call: InferCall, phases: Phases) -> InferAnswer:
    name = call.name
    header_length = None if call.parsed else header_length_of(call.header_length)  # 0: a raw binary request
    req, parts, forward_length, use = await checked_call(service, model, call)
    current = await still_serving(service, name, call.version)  # the version may have switched while the body arrived
    if current is not model:
        model = current
        phases.runners = model.runners
        req, parts, forward_length, use = await checked_call(service, model, call)
    phases.runners = model.runners
    if model.runners is not None and model.runners.decoupled:
        raise InvalidInput(f"model {name!r} is decoupled (it streams many responses to one request), so a "
                           f"one-response infer does not serve it: use gRPC ModelStreamInfer or POST "
                           f"/v2/models/{name}/generate_stream", subject=name)
    phases.batch, phases.checked = batch_size(model, req), time.monotonic_ns()
    # shared memory is never cached: an input region's bytes may change under the same request, and
    # an output region is the caller's to be written, each time
    key = None
    if model.response_cache and use is None and req is not None:
        key = await request_key_off_loop(name, model.digest, req)  # type: ignore[arg-type]  # READY: a digest
        kept = service.response_cache.get(key)
        if kept is not None:
            hit = await _from_cache(call, req, kept)
            phases.cache_hit_ns = time.monotonic_ns() - phases.checked
            return hit
        phases.cache_miss_ns = time.monotonic_ns() - phases.checked
    headers = body_headers(forward_length)
    regions = list(use.regions.values()) if use is not None else ()
    arena = _arena_forward(model, call, req, use, header_length)
    if model.sequences is not None:   # a sequence model's request is checked here (checked_off_loop): req is set
        answer = await model.sequences.forward(req, parts, forward_length, regions)  # type: ignore[arg-type]  # set: see above
    elif model.batcher is not None and req is not None and use is None:
        answer = await model.batcher.submit(req, parts, headers)   # never in the arena (arena_slot_for)
        phases.execution = 0   # its execution: counted by the batcher
    else:
        answer = await model.runners.forward(  # type: ignore[union-attr]  # READY: it has its runners
            infer_path(name), parts, headers, regions, arena)
    phases.answered, phases.runner_timing = time.monotonic_ns(), answer.timing
    label = f"runner for {name}"
    outputs = model.carton.outputs  # type: ignore[union-attr]  # READY: it has its carton
    answer, parsed = await checked_answer_off_loop(answer, outputs, label)
    if key is not None and parsed is not None and service.models.get(name) is model and model.state == "READY":
        storing = time.monotonic_ns()   # kept only while this version serves: an unload or switch drops its answers
        service.response_cache.put(key, await cached_answer_off_loop(name, parsed.doc, parsed.outputs))
        phases.cache_miss_ns += time.monotonic_ns() - storing  # type: ignore[operator]  # set with key
    if call.parsed and parsed is not None:
        return InferAnswer(200, answer.headers, answer.body, doc=parsed.doc,
                           outputs=_client_outputs(parsed, use, arena if answer.arena else None, label))
    out_headers = dict(answer.headers)
    payload: bytes | bytearray | memoryview = answer.body
    tail: list[memoryview] = []
    if use is not None:
        payload = renamed_answer(answer.status, out_headers, payload, use)
    elif answer.arena and answer.status == 200:
        payload, tail = arena.client_answer(out_headers, payload, label)  # type: ignore[union-attr]  # sent through it
    if answer.status == 200 and call.accept_encoding:
        payload, tail = await _compressed(call.accept_encoding, out_headers, payload, tail)
    return InferAnswer(answer.status, out_headers, payload,
                       f"runner: {error_text(payload)}" if answer.status >= 400 else None, tail)


async def _from_cache(call: InferCall, req: InferRequest, kept: CachedAnswer) -> InferAnswer:
    """A kept answer for ``req``, with its id, in the form its door and
    client want."""
    doc, tensors = kept.answer_doc(req.id), kept.tensors()
    if call.parsed:
        return InferAnswer(200, {}, b"", doc=doc, outputs=tensors)
    parts, length = encode_answer_tensors(doc, tensors, req.wants_binary)
    headers = body_headers(length)
    payload: bytes | bytearray | memoryview = parts[0]
    tail = [memoryview(part) for part in parts[1:]]
    if call.accept_encoding:
        payload, tail = await _compressed(call.accept_encoding, headers, payload, tail)
    return InferAnswer(200, headers, payload, tail=tail)


def _arena_forward(model: LoadedModel, call: InferCall, req: InferRequest | None, use: ShmUse | None,
                   header_length: int | None) -> ArenaForward | None:
    """The request in the arena's form, when its body is in the model
    version's own arena (after a switch a slot is not the new runners')."""
    slot = call.slot
    if slot is None or slot.arena is not getattr(model.runners, "arena", None) or use is not None:
        return None
    if call.request is not None:   # its data lie in the slot from its start, in order
        size = sum(len(t.data) for t in call.request.inputs if t.data is not None)
        return ArenaForward(slot, size, 0, call.request, runner_doc(call.request))
    if header_length is None or header_length > MAX_HEADER:
        return None
    # a binary body is checked in this process (check workers take JSON alone): req is set
    return ArenaForward(slot, len(call.body), header_length, req)  # type: ignore[arg-type]  # req: see above


def _client_outputs(parsed: ParsedAnswer, use: ShmUse | None, arena: ArenaForward | None,
                    label: str) -> list[WireTensor]:
    """A runner's outputs as the client is to see them: their bytes (views
    of the answer or the arena slot), regions by the client's names."""
    client_names = use.client_names() if use is not None else {}
    for tensor in parsed.outputs:
        if tensor.shm is None:
            continue
        if arena is not None and tensor.shm.region == ARENA_REGION:
            tensor.data = arena.output_view(tensor.name, tensor.datatype, tensor.shm.offset, tensor.shm.byte_size,
                                            label)
            tensor.parameters = {k: v for k, v in tensor.parameters.items() if k not in _SHM_KEYS}
        elif tensor.shm.region in client_names:
            tensor.parameters = with_region(tensor.parameters, client_names[tensor.shm.region])
    return parsed.outputs


_SHM_KEYS = frozenset({REGION, "shared_memory_offset", "shared_memory_byte_size"})


async def _compressed(accept_encoding: str, headers: dict[str, str], payload: bytes | bytearray | memoryview,
                      tail: list[memoryview]) -> tuple[bytes | bytearray | memoryview, list[memoryview]]:
    """The answer compressed when the client accepts gzip or deflate and it
    is worth it; ``headers`` say so."""
    coding = pick_encoding(accept_encoding, ENCODINGS, wildcard=True)
    if coding is None or len(payload) + sum(len(t) for t in tail) <= _SMALL_ANSWER:
        return payload, tail
    if tail:
        payload, tail = b"".join([payload, *tail]), []
    payload = _compress(payload, coding) if len(payload) < IN_THREAD_FROM else \
        await asyncio.to_thread(_compress, payload, coding)
    headers["Content-Encoding"] = coding
    headers["Vary"] = "Accept-Encoding"
    return payload, tail


def _compress(body: bytes | bytearray | memoryview, coding: str) -> bytes:
    c = zlib.compressobj(1, zlib.DEFLATED, 31 if coding == "gzip" else 15)
    return c.compress(body) + c.flush()
