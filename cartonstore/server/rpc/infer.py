"""ModelInfer over gRPC: the request parsed straight from its message
(v2/grpc_form.py: each raw_input_contents entry a memoryview), then the inference
core every door takes (server/inference/: the same checks, arena,
batching and runners), and the runner's answer, parsed once there, made
into a ModelInferResponse."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing

import grpc
from tritonclient.grpc import service_pb2 as pb

from cartonstore.errors import CartonStoreError, InvalidInput
from cartonstore.runner.protocol import FINAL_PARAMETER
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
from cartonstore.server.inference.models import serving_on_demand
from cartonstore.server.inference.stream import decoupled, infer_stream
from cartonstore.server.models.service import ModelService
from cartonstore.server.tensors.shm_regions import Peer
from cartonstore.v2.error_body import error_text
from cartonstore.v2.grpc_form import parameter_value, request_of, response_of

# Triton's request parameter (tritonclient's enable_empty_final_response): end a decoupled stream with an empty one
EMPTY_FINAL = "triton_enable_empty_final_response"

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


def streams(service: ModelService, request: pb.ModelInferRequest) -> bool:
    """Whether ``request`` names a loaded decoupled model (many responses to it)."""
    return decoupled(service.models.get(request.model_name))


def loads_first(service: ModelService, request: pb.ModelInferRequest) -> bool:
    """Whether ``request`` names a model that is not loaded and that it loads
    on demand: whether it streams is known once it is loaded."""
    return service.turnover.loads_on_demand(request.model_name)


async def grpc_loaded_then_answered(service: ModelService, request: pb.ModelInferRequest, peer: Peer,
                                    max_request_size: int) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
    """A stream's request to a model it loads on demand: loaded first, then
    answered as the model is, each response of a decoupled one or the one
    answer of another."""
    try:
        await serving_on_demand(service, request.model_name, request.model_version or None)
        if not streams(service, request):
            answer = await grpc_infer(service, request, peer, max_request_size)
            yield pb.ModelStreamInferResponse(infer_response=answer)
            return
    except CartonStoreError as e:
        yield stream_error(request, e)
        return
    async with aclosing(grpc_stream_infer(service, request, peer, max_request_size)) as responses:
        async for response in responses:
            yield response


async def grpc_stream_infer(service: ModelService, request: pb.ModelInferRequest, peer: Peer,
                            max_request_size: int) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
    """A decoupled model's responses to one request of a ModelStreamInfer,
    as Triton sends them: each with triton_final_response false, then,
    when the request's EMPTY_FINAL asks, an empty one with
    it true. A failure is one error_message response, which ends them."""
    try:
        name, version = request.model_name, request.model_version or None
        model = serving_or_loadable(service, name, version)
        req = request_of(request)
        length = sum(len(t.data) for t in req.inputs if t.data is not None)
        if length > max_request_size:
            raise too_large(length, max_request_size)
        async with aclosing(infer_stream(service, model, InferCall(name, version, peer, request=req))) as answers:
            async for answer in answers:
                if answer.status != 200:
                    raise StatusError(answer.status, error_text(answer.joined()))
                yield pb.ModelStreamInferResponse(infer_response=response_of(answer.doc or {}, answer.outputs))
    except CartonStoreError as e:
        yield stream_error(request, e)
        return
    if EMPTY_FINAL in request.parameters and parameter_value(request.parameters[EMPTY_FINAL]) is True:
        final = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version,
                                      id=request.id)
        final.parameters[FINAL_PARAMETER].bool_param = True
        yield pb.ModelStreamInferResponse(infer_response=final)


def _converted(answer: InferAnswer) -> pb.ModelInferResponse:
    """The runner's answer as a ModelInferResponse (before the arena slot
    its outputs may lie in is released)."""
    return response_of(answer.doc or {}, answer.outputs)


def stream_error(request: pb.ModelInferRequest, exc: CartonStoreError) -> pb.ModelStreamInferResponse:
    """A failed request of a stream: its error, and the request's id and model."""
    return pb.ModelStreamInferResponse(error_message=str(exc), infer_response=pb.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id))
