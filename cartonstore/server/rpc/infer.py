"""ModelInfer over gRPC: the request parsed straight from its message
(v2/grpc_form.py: each raw_input_contents entry a memoryview), then the inference
core every door takes (server/inference/: the same checks, arena,
batching and runners), and the runner's answer, parsed once there, made
into a ModelInferResponse."""

from __future__ import annotations

import asyncio

import grpc
from tritonclient.grpc import service_pb2 as pb

from cartonstore.errors import CartonStoreError, InvalidInput
from cartonstore.server.calls.bodies import IN_THREAD_FROM, too_large
from cartonstore.server.inference import (
    InferAnswer,
    InferCall,
    StatusError,
    arena_slot_for,
    infer,
    serving_or_loadable,
    status_of,
)
from cartonstore.server.models.service import ModelService
from cartonstore.server.tensors.shm_regions import Peer
from cartonstore.v2.error_body import error_text
from cartonstore.v2.grpc_form import request_of, response_of

_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
          403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
          409: grpc.StatusCode.FAILED_PRECONDITION, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
          429: grpc.StatusCode.UNAVAILABLE, 501: grpc.StatusCode.UNIMPLEMENTED, 503: grpc.StatusCode.UNAVAILABLE,
          504: grpc.StatusCode.DEADLINE_EXCEEDED}


def code_for_status(status: int) -> grpc.StatusCode:
    """The gRPC code of what HTTP would answer with ``status``."""
    return _CODES.get(status, grpc.StatusCode.INTERNAL if status >= 500 else grpc.StatusCode.INVALID_ARGUMENT)


def code_for(exc: CartonStoreError) -> grpc.StatusCode:
    return code_for_status(status_of(exc))


async def grpc_infer(service: ModelService, request: pb.ModelInferRequest, peer: Peer,
                     max_request_size: int) -> pb.ModelInferResponse:
    """One ModelInfer; a CartonStoreError (StatusError for a runner's
    error answer) says why it failed."""
    name, version = request.model_name, request.model_version or None
    if not name:
        raise InvalidInput("an infer request names its model (model_name is empty)")
    model = serving_or_loadable(service, name, version)   # an unknown model is refused before anything is parsed
    # raw_input_contents are taken as they are; typed contents are packed element by element: big ones off the loop
    typed_and_big = not request.raw_input_contents and request.ByteSize() >= IN_THREAD_FROM
    req = await asyncio.to_thread(request_of, request) if typed_and_big else request_of(request)
    data = [t.data for t in req.inputs if t.data is not None]
    length = sum(len(d) for d in data)
    if length > max_request_size:
        raise too_large(length, max_request_size)
    slot = arena_slot_for(model, length)
    try:
        if slot is not None:   # copied once, straight into the memory the runner reads
            at = 0
            for part in data:
                slot.view[at:at + len(part)] = part
                at += len(part)
        call = InferCall(name, version, peer, slot=slot, request=req)
        answer = await infer(service, model, call, convert=_converted)
        if answer.status != 200:
            raise StatusError(answer.status, error_text(answer.joined()))
        return answer.converted
    finally:
        if slot is not None:
            slot.release()


def _converted(answer: InferAnswer) -> pb.ModelInferResponse:
    """The runner's answer as a ModelInferResponse (before the arena slot
    its outputs may lie in is released)."""
    return response_of(answer.doc or {}, answer.outputs)


def stream_error(request: pb.ModelInferRequest, exc: CartonStoreError) -> pb.ModelStreamInferResponse:
    """A failed request of a stream: its error, and the request's id and model."""
    return pb.ModelStreamInferResponse(error_message=str(exc), infer_response=pb.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id))
