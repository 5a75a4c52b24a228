"""Triton's generate extension, for any model:

    POST /v2/models/{name}[/versions/{version}]/generate          one JSON answer
    POST /v2/models/{name}[/versions/{version}]/generate_stream   server-sent events

The request's fields are the model's inputs by name (v2/generate_form.py),
run through the inference core: a decoupled model's stream
(server/inference/stream.py), any other's one infer. ``generate`` answers
one response (a decoupled model that streams more than one is refused, as
Triton refuses it); ``generate_stream`` answers ``text/event-stream``, one
``data: {...}`` event per response, written before the next is read from
the runner (a slow client slows the model). An error before the first
event is an ordinary error answer; one after it is a last event
``data: {"error": ...}``, the status being sent already.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from aiohttp import web

from cartonstore.errors import BadUpstream, CartonStoreError, InvalidInput
from cartonstore.format.dtypes import carton_dtype_to_v2
from cartonstore.server.inference import InferCall, StatusError, infer, serving_or_loadable
from cartonstore.server.inference.models import serving_on_demand
from cartonstore.server.inference.stream import decoupled, infer_stream
from cartonstore.server.models.loaded_model import LoadedModel
from cartonstore.server.tensors.shm_regions import peer_of
from cartonstore.v2.error_body import error_text
from cartonstore.v2.framing import HEADER_LENGTH, header_length, parse_infer_answer
from cartonstore.v2.generate_form import generate_request, generate_response

from .context import body_json, svc
from .responses import error

SSE = "text/event-stream; charset=utf-8"


async def generate(request: web.Request) -> web.Response:
    answers = _answers(request)
    async with aclosing(answers):
        try:
            first = await anext(answers, None)
            more = await anext(answers, None) if first is not None else None
        except StatusError as e:   # the runner's error answer, its status passed on
            return error(e.status, str(e))
        if first is None:
            raise BadUpstream(f"model {request.match_info['name']!r} sent no response to the generate request")
        if more is not None:
            raise InvalidInput(f"model {request.match_info['name']!r} sent more than one response to a generate "
                               f"request: use POST .../generate_stream")
    return web.json_response(first)


async def generate_stream(request: web.Request) -> web.StreamResponse:
    answers = _answers(request)
    async with aclosing(answers):
        try:
            first = await anext(answers, None)   # an error before it is an ordinary error answer
        except StatusError as e:
            return error(e.status, str(e))
        response = web.StreamResponse(headers={"Content-Type": SSE, "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            if first is not None:   # a decoupled model may send no response: no event
                await _event(response, first)
            async for answer in answers:
                await _event(response, answer)
        except CartonStoreError as e:
            await _event(response, {"error": str(e)})
        except ConnectionResetError:
            return response   # the client left: the stream is closed, and with it the runner's
    await response.write_eof()
    return response


async def _event(response: web.StreamResponse, doc: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(doc).encode() + b"\n\n")


async def _answers(request: web.Request) -> AsyncGenerator[dict[str, Any], None]:
    """Each response to the request, as a generate response; a
    CartonStoreError for a failure."""
    service = svc(request)
    name, version = request.match_info["name"], request.match_info.get("version")
    model = serving_or_loadable(service, name, version)
    if request.transport is None:
        raise InvalidInput("the connection closed before its request was read")
    peer = peer_of(request.transport)
    fields = await body_json(request)
    if model is None:   # its inputs, and whether it streams, are known once it is loaded
        model = await serving_on_demand(service, name, version)
    doc = generate_request(fields, _input_datatypes(model))
    call = InferCall(name, version, peer, json.dumps(doc).encode())
    if decoupled(model):
        async with aclosing(infer_stream(service, model, call)) as streamed:
            async for answer in streamed:
                if answer.status != 200:
                    raise StatusError(answer.status, error_text(answer.joined()))
                yield generate_response(answer.doc or {}, answer.outputs)
        return
    answer = await infer(service, model, call)
    if answer.status != 200:
        raise StatusError(answer.status, error_text(answer.joined()))
    yield generate_response(*parse_infer_answer(answer.joined(), header_length(answer.headers.get(HEADER_LENGTH))))


def _input_datatypes(model: LoadedModel) -> dict[str, str]:
    carton = model.carton
    return {spec.name: carton_dtype_to_v2(spec.dtype) for spec in (carton.inputs or ())} if carton else {}


def add_routes(router: web.UrlDispatcher) -> None:
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        router.add_post(f"{prefix}/generate", generate)
        router.add_post(f"{prefix}/generate_stream", generate_stream)
