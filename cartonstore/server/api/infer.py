"""POST /v2/models/{name}[/versions/{version}]/infer: validate, then proxy.

The daemon checks every request against the carton's declared tensors
(cartonstore.v2.validate) before a runner sees it, then forwards the body
as it came (decoded from its Content-Encoding): no binary tensor is
decoded or copied on the way. A raw binary request (Inference-Header-
Content-Length: 0) gets a JSON header here, so runners only ever see the
framed form; JSON "data" inputs, already parsed and checked, are sent on
as binary tensor data (v2/binary_form.py), so a runner does not parse
them again (except in the shared-memory and arena forms).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from cartonstore.errors import InvalidInput, NotFound
from cartonstore.server.models.loaded_model import triton_unknown_model
from cartonstore.server.runners.answer_check import BYTES, checked_answer_off_loop
from cartonstore.server.tensors.arena import ARENA_FROM, ArenaSlot
from cartonstore.server.tensors.arena_wire import MAX_HEADER, ArenaForward
from cartonstore.server.tensors.infer_check import checked_unless_shm
from cartonstore.server.tensors.infer_shm import ShmUse, attach_regions, renamed_answer, renamed_request
from cartonstore.server.tensors.shm_regions import Peer, ShmRegions, peer_of
from cartonstore.store.names import check_model_ref
from cartonstore.v2.error_body import error_text
from cartonstore.v2.framing import (
    HEADER_LENGTH,
    InferRequest,
    surely_plain,
)
from cartonstore.v2.framing import header_length as header_length_of
from cartonstore.v2.shm_params import REGION
from cartonstore.v2.statistics import RequestTiming
from cartonstore.v2.validate import parse_raw_binary_for, validate_request

from .blobs import pick_encoding
from .bodies import ENCODINGS, IN_THREAD_FROM, request_body
from .context import svc
from .responses import ERROR_TEXT

if TYPE_CHECKING:
    from cartonstore.server.models.loaded_model import LoadedModel
    from cartonstore.server.models.service import ModelService
    from cartonstore.server.tensors.check_pool import CheckPool

SHM_MARK = REGION.encode()
STREAM_ANSWER = 64 * 1024         # larger answers: headers and body written apart, so neither is copied
CLIENT_SEND_BUFFER = 4 << 20      # a 4 MiB answer leaves in one send, not copied into asyncio's buffer


def arena_slot_for(model: LoadedModel | None, length: int) -> ArenaSlot | None:
    """A slot for a big binary request of ``length`` bytes and its outputs
    (as many bytes again) in the model version's own arena, when its
    runners map it and one is free; None otherwise (the request goes over
    the runner's socket, as a dynamically batched model's requests always
    do). The HTTP front and gRPC both take theirs here."""
    runners = getattr(model, "runners", None)
    if length < ARENA_FROM or runners is None or runners.arena is None or not runners.arena_capable \
            or getattr(model, "batcher", None) is not None:
        return None
    return runners.arena.take(2 * length + 64)


def ready_model(service: ModelService, name: str, version: str | None) -> LoadedModel:
    """The READY model (version) a request names, runner or not (its files
    are served either way), or the error that says why not."""
    check_model_ref(name, version)
    model = service.models.get(name)
    if model is None or model.digest is None:
        raise NotFound(f"{triton_unknown_model(name)}: model {name!r} is not loaded; load it first "
                       f"(POST /v2/repository/models/{name}/load)", subject=name)
    if version is not None and version != model.digest:
        raise NotFound(f"{triton_unknown_model(name, version)}: the loaded version is {model.digest}",
                       subject=version)
    if model.state != "READY":
        raise InvalidInput(f"model {name!r} is not ready ({model.state.lower()}: {model.reason})", subject=name)
    return model


def serving_model(service: ModelService, name: str, version: str | None) -> LoadedModel:
    """The loaded model an infer request is for: READY, with runners."""
    model = ready_model(service, name, version)
    if model.runners is None:
        runner = model.carton.runner.runner_name if model.carton else "?"
        raise InvalidInput(f"model {name!r} is loaded as files only: no runner is configured for its "
                           f"runner_name {runner!r}, so it cannot run inference", subject=name)
    return model


# request (None: checked in a check worker), parts, header length, regions
Checked = tuple["InferRequest | None", list, int | None, ShmUse | None]


def checked_request(model: LoadedModel, body: bytes | bytearray | memoryview, header_length: int | None,
                    shm: tuple[ShmRegions, Peer]) -> Checked:
    """Parse and validate; returns the request, what to forward (body
    parts, header length) and the shared memory regions it names, checked
    for the caller (``shm``: the registry and who is asking)."""
    inputs, outputs = model.carton.inputs, model.carton.outputs
    if header_length == 0:
        req = parse_raw_binary_for(body, inputs)
        validate_request(req, inputs, outputs)
        return req, *_framed(req), None
    req, forward = checked_unless_shm(body, header_length, inputs, outputs)
    if forward is not None:
        return req, *forward, None
    use = attach_regions(req, *shm)
    validate_request(req, inputs, outputs)
    return req, *renamed_request(body, header_length, use), use


def _framed(req: InferRequest) -> tuple[list, int]:
    tensor = req.inputs[0]
    header = json.dumps({"inputs": [{"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape,
                                     "parameters": {"binary_data_size": len(tensor.data)}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return [header, tensor.data], len(header)


def _compress(body: bytes | bytearray | memoryview, coding: str) -> bytes:
    c = zlib.compressobj(1, zlib.DEFLATED, 31 if coding == "gzip" else 15)
    return c.compress(body) + c.flush()


@dataclass
class InferAnswer:
    """What the runner answered, as the client gets it (maybe compressed)."""

    status: int
    headers: dict[str, str]
    payload: bytes | bytearray | memoryview
    error_text: str | None = None   # for the daemon's log line, on errors
    tail: list[memoryview] = field(default_factory=list)   # sent after payload (views of an arena slot)
    converted: Any = None   # the answer in another framing (proxied_infer's convert)

    @property
    def size(self) -> int:
        return len(self.payload) + sum(len(part) for part in self.tail)

    def joined(self) -> bytes | bytearray:
        return b"".join([self.payload, *self.tail]) if self.tail else self.payload


@dataclass
class _Phases:
    """Where a request's time went in the daemon, for the statistics of
    the model version (``runners``) that ran it."""

    started: int = field(default_factory=time.monotonic_ns)
    runners: Any = None          # the ModelRunners it was forwarded to
    checked: int = 0             # monotonic ns at each step's end
    answered: int = 0
    runner_timing: RequestTiming | None = None
    batch: int = 1
    execution: int | None = None   # rows of the execution it starts (None: its own batch; 0: counted elsewhere)

    def record(self, model: LoadedModel, ok: bool) -> None:
        runners = self.runners if self.runners is not None else model.runners
        if runners is None:
            return
        now = time.monotonic_ns()
        if not ok:
            runners.statistics.record_failure(now - self.started)
            return
        checking, shaping = self.checked - self.started, now - self.answered
        round_trip = self.answered - self.checked
        inside = self.runner_timing.believed(round_trip) if self.runner_timing is not None else None
        if inside is None:   # a runner that does not say: its whole round trip is the model's time
            timing = RequestTiming(0, checking, round_trip, shaping)
        else:
            timing = RequestTiming(inside.queue_ns, checking + inside.input_ns, inside.infer_ns,
                                   inside.output_ns + shaping)
        runners.statistics.record_success(now - self.started, timing, self.batch, self.execution)


async def proxied_infer(service: ModelService, model: LoadedModel, name: str, version: str | None,
                        body: bytes | bytearray | memoryview, sent_length: str | None, accept_encoding: str,
                        peer: Peer, slot: ArenaSlot | None = None,
                        convert: Callable[[InferAnswer], Any] | None = None) -> InferAnswer:
    """Validate a whole (decoded) request body from ``peer`` against
    ``model`` and forward it; the runner's answer, compressed when
    ``accept_encoding`` asks. ``slot``: the arena slot ``body`` was
    received into (the caller releases it once the answer is written).
    ``convert``: turns a successful answer into another framing's
    (``answer.converted``); if it raises, the request failed.
    Every request that reached a model's check counts in its statistics."""
    phases = _Phases()
    try:
        answer = await _proxied(service, model, name, version, body, sent_length, accept_encoding, peer, slot,
                                phases)
        if convert is not None and answer.status < 400:
            answer.converted = convert(answer)
    except BaseException:
        phases.record(model, False)
        raise
    phases.record(model, answer.status < 400)
    return answer


def _batch_size(model: LoadedModel, req: InferRequest | None) -> int:
    """What one request adds to inference_count: 1, or for a model whose
    first dimension is a batch (max_batch_size > 0) that batch, refused as
    Triton refuses it when over max_batch_size or unequal across inputs."""
    limit = model.max_batch_size
    if not limit or req is None or not req.inputs:
        return 1
    batches = {tensor.shape[0] if tensor.shape else None for tensor in req.inputs}
    if None in batches or len(batches) > 1:
        raise InvalidInput(f"model {model.name!r} takes a batch (max_batch_size {limit}): every input's first "
                           f"dimension is its batch size, one value for all inputs (got "
                           f"{', '.join(f'{t.name} {t.shape}' for t in req.inputs)})", subject=model.name)
    batch = batches.pop()
    if batch > limit:
        raise InvalidInput(f"inference request batch-size must be <= {limit} for {model.name!r} (got {batch})",
                           subject=model.name)
    return max(batch, 1)


async def _proxied(service: ModelService, model: LoadedModel, name: str, version: str | None,
                   body: bytes | bytearray | memoryview, sent_length: str | None, accept_encoding: str,
                   peer: Peer, slot: ArenaSlot | None, phases: _Phases) -> InferAnswer:
    header_length = header_length_of(sent_length)  # 0: a raw binary request
    shm = (service.shm_regions, peer)
    req, parts, forward_length, use = await _checked_off_loop(model, body, header_length, shm, service.check_pool)
    current = serving_model(service, name, version)  # the version may have switched while the body arrived
    if current is not model:
        model = current
        phases.runners = model.runners
        req, parts, forward_length, use = await _checked_off_loop(model, body, header_length, shm, service.check_pool)
    phases.runners = model.runners
    phases.batch, phases.checked = _batch_size(model, req), time.monotonic_ns()
    headers = {"Content-Type": "application/octet-stream" if forward_length is not None else "application/json"}
    if forward_length is not None:
        headers[HEADER_LENGTH] = str(forward_length)
    regions = list(use.regions.values()) if use is not None else ()
    # A slot is in one model version's own arena: after a switch it is not the new runners'.
    own_slot = slot is not None and slot.arena is getattr(model.runners, "arena", None)
    arena = ArenaForward(slot, len(body), header_length, req) \
        if own_slot and use is None and header_length is not None and header_length <= MAX_HEADER else None
    if model.batcher is not None and req is not None and use is None:
        answer = await model.batcher.submit(req, parts, headers)   # never in the arena (arena_slot_for)
        phases.execution = 0   # its execution: counted by the batcher
    else:
        answer = await model.runners.forward(f"/v2/models/{name}/infer", parts, headers, regions, arena)
    phases.answered, phases.runner_timing = time.monotonic_ns(), answer.timing
    answer = await checked_answer_off_loop(answer, model.carton.outputs, f"runner for {name}")
    out_headers = dict(answer.headers)
    payload: bytes | bytearray | memoryview = answer.body
    tail: list[memoryview] = []
    if use is not None:
        payload = renamed_answer(answer.status, out_headers, payload, use)
    elif answer.arena and answer.status == 200:
        payload, tail = arena.client_answer(out_headers, payload, f"runner for {name}")
    coding = pick_encoding(accept_encoding, ENCODINGS, wildcard=True) if answer.status == 200 else None
    if coding is not None and len(payload) + sum(len(t) for t in tail) > 512:
        if tail:
            payload, tail = b"".join([payload, *tail]), []
        payload = _compress(payload, coding) if len(payload) < IN_THREAD_FROM else \
            await asyncio.to_thread(_compress, payload, coding)
        out_headers["Content-Encoding"] = coding
        out_headers["Vary"] = "Accept-Encoding"
    return InferAnswer(answer.status, out_headers, payload,
                       f"runner: {error_text(payload)}" if answer.status >= 400 else None, tail)


async def infer(request: web.Request) -> web.StreamResponse:
    """The aiohttp route; the daemon's front (front.py) answers most infer
    requests itself, and gives aiohttp those it does not frame (chunked)."""
    service = svc(request)
    name, version = request.match_info["name"], request.match_info.get("version")
    model = serving_model(service, name, version)  # an unknown model is refused before its body is read
    if request.transport is None:
        raise InvalidInput("the connection closed before its request was read")
    peer = peer_of(request.transport)   # before an await: a connection gone meanwhile has no socket to ask
    body = await request_body(request)
    answer = await proxied_infer(service, model, name, version, body, request.headers.get(HEADER_LENGTH),
                                 request.headers.get("Accept-Encoding", ""), peer)
    payload = answer.joined()   # no slot here: nothing to join, in fact
    if len(payload) >= STREAM_ANSWER:
        return await _streamed(request, answer.status, answer.headers, payload)
    response = web.Response(status=answer.status, body=payload, headers=answer.headers)
    if answer.error_text:
        response[ERROR_TEXT] = answer.error_text
    return response


async def _checked_off_loop(model: LoadedModel, body: bytes | bytearray | memoryview, header_length: int | None,
                            shm: tuple[ShmRegions, Peer], pool: CheckPool | None) -> Checked:
    """checked_request; off the event loop when JSON or BYTES elements to
    walk would hold it for a while: an all-JSON body in a check worker
    (the request comes back as None: only the arena, never used for JSON,
    needs it), anything else in a thread."""
    if _walks_little(model, body, header_length):
        return checked_request(model, body, header_length, shm)
    # the worker tells shm apart; a batched model's request is wanted back to count its batch
    if pool is not None and header_length is None and len(body) >= IN_THREAD_FROM and not model.max_batch_size:
        forward = await pool.check(model.carton.inputs, model.carton.outputs, body)
        if forward is not None:
            return None, *forward, None
    return await asyncio.to_thread(checked_request, model, body, header_length, shm)


def _walks_little(model: LoadedModel, body: bytes | bytearray | memoryview, header_length: int | None) -> bool:
    """Whether validating takes little time whatever the body's size: a
    small body naming no shared memory (whose BYTES would be read), or a big
    binary one whose JSON header is small and names no BYTES (numeric
    tensors are checked by their sizes alone). A header with an escape in
    it (which could spell either) goes to a thread."""
    if header_length is None:
        return len(body) < IN_THREAD_FROM and surely_plain(body, SHM_MARK)   # never a view
    if header_length == 0:
        spec = model.carton.inputs
        return len(body) < IN_THREAD_FROM or not (spec and len(spec) == 1 and spec[0].dtype == "string")
    if header_length > len(body):
        return True    # refused at once
    if header_length >= IN_THREAD_FROM:
        return False
    header = bytes(memoryview(body)[:header_length])
    return surely_plain(header, SHM_MARK) and (surely_plain(header, BYTES) or len(body) < IN_THREAD_FROM)


def widen_send_buffer(transport: object) -> None:
    """A big answer leaves a Unix socket in one send, not copied into the
    transport's buffer (TCP tunes its own buffers)."""
    sock = transport.get_extra_info("socket") if transport is not None else None  # type: ignore[attr-defined]  # an asyncio transport, or None
    if sock is not None and sock.family == socket.AF_UNIX:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CLIENT_SEND_BUFFER)


async def _streamed(request: web.Request, status: int, headers: dict[str, str],
                    payload: bytes | bytearray) -> web.StreamResponse:
    """A big answer sent without copies: aiohttp would join it with the
    headers (Python < 3.12 has no gathering writelines), and the transport
    keeps a copy of whatever the socket did not take at once."""
    response = web.StreamResponse(status=status, headers=headers)
    response.content_length = len(payload)
    widen_send_buffer(request.transport)
    await response.prepare(request)
    try:
        await response.write(b"")   # the headers alone
        await response.write(memoryview(payload))
        await response.write_eof()
    except ConnectionResetError:
        pass   # the client left: aiohttp ends the connection as it does for any response it cannot send
    return response
