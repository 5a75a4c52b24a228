"""Checking an infer request against its model before a runner sees it,
and what to forward: from a body as HTTP sends it (parsed here, the body
forwarded as it came where it can be), or from a request a door parsed
itself (gRPC's message: validated as it is, then framed once for the
runner). Requests that name shared memory have their regions checked for
the caller. Big walks (JSON, BYTES) go off the event loop."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from cartonstore.errors import InvalidInput
from cartonstore.runner.protocol import ARENA_OUTPUTS
from cartonstore.server.calls.bodies import IN_THREAD_FROM
from cartonstore.server.checks.request_check import checked_unless_shm
from cartonstore.server.runner_processes.answer_check import BYTES
from cartonstore.server.tensors.infer_shm import ShmUse, attach_regions, renamed_request
from cartonstore.server.tensors.shm_regions import Peer, ShmRegions
from cartonstore.v2.binary_form import encoded_doc, runner_doc
from cartonstore.v2.framing import InferRequest, surely_plain
from cartonstore.v2.shared_memory import REGION
from cartonstore.v2.validate import parse_raw_binary_for, validate_request

if TYPE_CHECKING:
    from cartonstore.server.checks.pool import CheckPool
    from cartonstore.server.models.loaded_model import LoadedModel

SHM_MARK = REGION.encode()

# request (None: checked in a check worker), parts, header length, regions
Checked = tuple["InferRequest | None", list, "int | None", "ShmUse | None"]


def checked_request(model: LoadedModel, body: bytes | bytearray | memoryview, header_length: int | None,
                    shm: tuple[ShmRegions, Peer]) -> Checked:
    """Parse and validate; returns the request, what to forward (body
    parts, header length) and the shared memory regions it names, checked
    for the caller (``shm``: the registry and who is asking)."""
    inputs, outputs = model.request_inputs, model.carton.outputs  # type: ignore[union-attr]  # READY: it has its carton
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
    size = len(tensor.data)  # type: ignore[arg-type]  # a raw binary request: the body is its one input's data
    header = json.dumps({"inputs": [{"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape,
                                     "parameters": {"binary_data_size": size}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return [header, tensor.data], len(header)


def checked_tensors(model: LoadedModel, req: InferRequest, shm: tuple[ShmRegions, Peer]) -> Checked:
    """A request a door parsed itself, validated against ``model``, with
    its regions checked for the caller; framed for the runner: the JSON
    header, then each input's data as it is."""
    if ARENA_OUTPUTS in req.parameters:   # it tells a runner where to write: the daemon's alone to give
        raise InvalidInput(f"infer request: parameter {ARENA_OUTPUTS!r} is reserved for the daemon",
                           subject=ARENA_OUTPUTS)
    use = attach_regions(req, *shm) if any(t.shm is not None for t in req.inputs) or req.shm_outputs() else None
    validate_request(req, model.request_inputs, model.carton.outputs)  # type: ignore[union-attr]  # READY: a carton
    header = encoded_doc(runner_doc(req, use.runner_names() if use is not None else None))
    data = [t.data for t in req.inputs if t.shm is None and t.data is not None and len(t.data)]
    return req, [header, *data], len(header), use


async def checked_off_loop(model: LoadedModel, body: bytes | bytearray | memoryview, header_length: int | None,
                           shm: tuple[ShmRegions, Peer], pool: CheckPool | None) -> Checked:
    """checked_request; off the event loop when JSON or BYTES elements to
    walk would hold it for a while: an all-JSON body in a check worker
    (the request comes back as None: only the arena, never used for JSON,
    needs it), anything else in a thread."""
    if _walks_little(model, body, header_length):
        return checked_request(model, body, header_length, shm)
    # the worker tells shm apart; a batched model's request is wanted back to count its batch, a
    # cached model's to make its key, a sequence model's for its sequence
    if pool is not None and header_length is None and len(body) >= IN_THREAD_FROM and not model.max_batch_size \
            and not model.response_cache and model.sequences is None:
        forward = await pool.check(model.carton.inputs, model.carton.outputs, body)  # type: ignore[union-attr]  # READY
        if forward is not None:
            return None, *forward, None
    return await asyncio.to_thread(checked_request, model, body, header_length, shm)


async def tensors_checked_off_loop(model: LoadedModel, req: InferRequest, shm: tuple[ShmRegions, Peer]) -> Checked:
    """checked_tensors; in a thread when BYTES elements to walk are many
    (numeric tensors are checked by their sizes alone)."""
    if _bytes_to_walk(req) >= IN_THREAD_FROM:
        return await asyncio.to_thread(checked_tensors, model, req, shm)
    return checked_tensors(model, req, shm)


def _bytes_to_walk(req: InferRequest) -> int:
    """The size of a request's BYTES inputs: sent, or to be read from shared memory."""
    size = 0
    for tensor in req.inputs:
        if tensor.datatype == "BYTES":
            size += len(tensor.data) if tensor.data is not None else tensor.shm.byte_size if tensor.shm else 0
    return size


def _walks_little(model: LoadedModel, body: bytes | bytearray | memoryview, header_length: int | None) -> bool:
    """Whether validating takes little time whatever the body's size: a
    small body naming no shared memory (whose BYTES would be read), or a big
    binary one whose JSON header is small and names no BYTES (numeric
    tensors are checked by their sizes alone). A header with an escape in
    it (which could spell either) goes to a thread."""
    if header_length is None:
        return len(body) < IN_THREAD_FROM and surely_plain(body, SHM_MARK)   # type: ignore[arg-type]  # never a view
    if header_length == 0:
        spec = model.request_inputs
        return len(body) < IN_THREAD_FROM or not (spec and len(spec) == 1 and spec[0].dtype == "string")
    if header_length > len(body):
        return True    # refused at once
    if header_length >= IN_THREAD_FROM:
        return False
    header = bytes(memoryview(body)[:header_length])
    return surely_plain(header, SHM_MARK) and (surely_plain(header, BYTES) or len(body) < IN_THREAD_FROM)


def batch_size(model: LoadedModel, req: InferRequest | None) -> int:
    """What one request adds to inference_count: 1, or for a model whose
    first dimension is a batch (max_batch_size > 0) that batch, refused as
    Triton refuses it when over max_batch_size or unequal across inputs."""
    limit = model.max_batch_size
    if not limit or req is None or not req.inputs:
        return 1
    firsts = [tensor.shape[0] for tensor in req.inputs if tensor.shape]
    if len(firsts) < len(req.inputs) or len(set(firsts)) > 1:
        raise InvalidInput(f"model {model.name!r} takes a batch (max_batch_size {limit}): every input's first "
                           f"dimension is its batch size, one value for all inputs (got "
                           f"{', '.join(f'{t.name} {t.shape}' for t in req.inputs)})", subject=model.name)
    batch = firsts[0]
    if batch > limit:
        raise InvalidInput(f"inference request batch-size must be <= {limit} for {model.name!r} (got {batch})",
                           subject=model.name)
    return max(batch, 1)
