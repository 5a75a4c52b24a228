"""ModelInfer over gRPC: the request framed as the HTTP binary form
(v2/grpc_form.py), then the one inference path every HTTP request takes
(api/infer.py's proxied_infer: the same checks, arena and runners), and
the answer framed back as a ModelInferResponse."""

from __future__ import annotations

import asyncio

import grpc
from tritonclient.grpc import service_pb2 as pb

from cartonstore.errors import BadUpstream, CartonStoreError, InvalidInput, http_status_for
from cartonstore.server.api.bodies import IN_THREAD_FROM, too_large
from cartonstore.server.api.infer import InferAnswer, arena_slot_for, proxied_infer, serving_model
from cartonstore.server.models.service import ModelService
from cartonstore.server.tensors.shm_regions import Peer
from cartonstore.v2.error_body import error_text
from cartonstore.v2.framing import HEADER_LENGTH
from cartonstore.v2.grpc_form import framed_request, grpc_response

_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
          403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
          409: grpc.StatusCode.FAILED_PRECONDITION, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
          429: grpc.StatusCode.UNAVAILABLE, 501: grpc.StatusCode.UNIMPLEMENTED, 503: grpc.StatusCode.UNAVAILABLE,
          504: grpc.StatusCode.DEADLINE_EXCEEDED}


def code_for_status(status: int) -> grpc.StatusCode:
    """The gRPC code of what HTTP would answer with ``status``."""
    return _CODES.get(status, grpc.StatusCode.INTERNAL if status >= 500 else grpc.StatusCode.INVALID_ARGUMENT)


class StatusError(CartonStoreError):
    """An error that stands for an HTTP status of its own (a runner's error
    answer; a call cartonstore does not implement), for the gRPC caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def code_for(exc: CartonStoreError) -> grpc.StatusCode:
    return code_for_status(exc.status if isinstance(exc, StatusError) else http_status_for(exc))


async def grpc_infer(service: ModelService, request: pb.ModelInferRequest, peer: Peer,
                     max_request_size: int) -> pb.ModelInferResponse:
    """One ModelInfer; a CartonStoreError (StatusError for a runner's
    error answer) says why it failed."""
    name, version = request.model_name, request.model_version or None
    if not name:
        raise InvalidInput("an infer request names its model (model_name is empty)")
    model = serving_model(service, name, version)   # an unknown model is refused before any framing
    # raw_input_contents are framed as they are; typed contents are packed element by element: big ones off the loop
    typed_and_big = not request.raw_input_contents and request.ByteSize() >= IN_THREAD_FROM
    parts, header_length = await asyncio.to_thread(framed_request, request) if typed_and_big else \
        framed_request(request)
    length = sum(len(p) for p in parts)
    if length > max_request_size:
        raise too_large(length, max_request_size)
    slot = arena_slot_for(model, length)
    try:
        if slot is not None:   # framed once, straight into the memory the runner reads
            at = 0
            for part in parts:
                slot.view[at:at + len(part)] = part
                at += len(part)
            body = slot.view[:length]
        else:
            body = parts[0] if len(parts) == 1 else b"".join(parts)  # type: ignore[assignment]  # bytes: a buffer as the view
        answer = await proxied_infer(service, model, name, version, body, str(header_length), "", peer, slot,
                                     convert=lambda a: _converted(a, name))
        if answer.status != 200:
            raise StatusError(answer.status, error_text(answer.joined()))
        return answer.converted
    finally:
        if slot is not None:
            slot.release()


def _converted(answer: InferAnswer, name: str) -> pb.ModelInferResponse:
    """The runner's answer as a ModelInferResponse (before the arena slot
    its outputs may lie in is released)."""
    sent = answer.headers.get(HEADER_LENGTH)
    try:
        return grpc_response([answer.payload, *answer.tail], int(sent) if sent else None)
    except (ValueError, KeyError, TypeError) as e:
        raise BadUpstream(f"the runner for {name} sent an answer that is not a v2 infer response: {e}") from None


def stream_error(request: pb.ModelInferRequest, exc: CartonStoreError) -> pb.ModelStreamInferResponse:
    """A failed request of a stream: its error, and the request's id and model."""
    return pb.ModelStreamInferResponse(error_message=str(exc), infer_response=pb.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id))


