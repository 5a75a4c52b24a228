"""A decoupled model's many responses to one request (Triton's decoupled
transaction policy), the inference core's second path: the request checked
as infer checks it, sent to a runner's stream route, and each response it
streams checked as an answer is (answer_check.py) and handed to the door as
an InferAnswer of parsed outputs.

Back-pressure: a reader task takes the runner's responses into a queue of
STREAM_QUEUE answers; once it is full the reader stops, the runner's
socket fills and its model waits at its yield. A door takes the next
answer only once it has written the previous one to its client, so a slow
client slows the model, and one stream holds at most STREAM_QUEUE answers
(each at most the model's answer limit) in the daemon.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import TYPE_CHECKING

from cartonstore.errors import InvalidInput
from cartonstore.runner.protocol import infer_stream_path
from cartonstore.server.runner_processes.answer_check import checked_answer_off_loop
from cartonstore.server.runner_processes.settings import RunnerResponse
from cartonstore.v2.binary_form import body_headers
from cartonstore.v2.error_body import error_text

from .answer import InferAnswer
from .models import serving_on_demand, still_serving
from .phases import Phases
from .pipeline import InferCall, checked_call

if TYPE_CHECKING:
    from cartonstore.server.models.loaded_model import LoadedModel
    from cartonstore.server.models.service import ModelService

STREAM_QUEUE = 16   # a stream's responses read from its runner and not yet taken by the door


def decoupled(model: LoadedModel | None) -> bool:
    return model is not None and model.runners is not None and model.runners.decoupled


async def infer_stream(service: ModelService, model: LoadedModel | None,
                       call: InferCall) -> AsyncGenerator[InferAnswer, None]:
    """Each response the decoupled ``model`` streams for ``call`` (loaded
    on demand when None): a 200 InferAnswer of parsed outputs each, or one
    error answer (the runner's, a 500 for the model failing mid-stream)
    that ends it. CartonStoreErrors as infer's. The stream counts in the
    statistics as one request, its whole time compute_infer; each response
    in response_stats by its index, as Triton counts a decoupled model's."""
    service.turnover.request_started(call.name)   # in flight until its last response: never unloaded for idling
    try:
        if model is None:
            model = await serving_on_demand(service, call.name, call.version)
        phases = Phases()
        ok = False
        try:
            async with aclosing(_streamed(service, model, call, phases)) as answers:
                async for answer in answers:
                    ok = answer.status < 400
                    yield answer
        except BaseException:
            ok = False
            raise
        finally:
            phases.answered = phases.answered or phases.checked
            phases.record(model, ok)
    finally:
        service.turnover.request_ended(call.name)


async def _streamed(service: ModelService, model: LoadedModel, call: InferCall,
                    phases: Phases) -> AsyncGenerator[InferAnswer, None]:
    name = call.name
    req, parts, forward_length, use = await checked_call(service, model, call)
    current = await still_serving(service, name, call.version)
    if current is not model:
        model = current
        req, parts, forward_length, use = await checked_call(service, model, call)
    if req is not None and req.shm_outputs():
        raise InvalidInput(f"model {name!r} is decoupled: its responses come in the stream, not in shared memory "
                           f"(request outputs without shared_memory_region)", subject=name)
    if not decoupled(model):
        raise InvalidInput(f"model {name!r} is not decoupled: it answers one response per request (ModelInfer, "
                           f"POST /v2/models/{name}/infer)", subject=name)
    phases.runners, phases.checked = model.runners, time.monotonic_ns()
    headers = body_headers(forward_length)
    regions = list(use.regions.values()) if use is not None else []
    label = f"runner for {name}"
    outputs = model.carton.outputs  # type: ignore[union-attr]  # READY: it has its carton
    responses = model.runners.forward_stream(  # type: ignore[union-attr]  # decoupled: it has its runners
        infer_stream_path(name), parts, headers, regions)
    statistics = model.runners.statistics  # type: ignore[union-attr]  # decoupled: it has its runners
    async with aclosing(_queued(responses)) as queued:
        index, before = 0, phases.checked
        async for response in queued:
            phases.answered = time.monotonic_ns()
            checked, parsed = await checked_answer_off_loop(response, outputs, label)
            shaped = time.monotonic_ns()
            statistics.record_response(index, phases.answered - before, shaped - phases.answered, parsed is not None)
            index, before = index + 1, shaped
            if parsed is None:
                yield InferAnswer(checked.status, checked.headers, checked.body,
                                  f"runner: {error_text(checked.body)}")
                return
            yield InferAnswer(200, checked.headers, checked.body, doc=parsed.doc, outputs=parsed.outputs)


async def _queued(responses: AsyncGenerator[RunnerResponse, None]) -> AsyncGenerator[RunnerResponse, None]:
    """``responses`` read ahead by a task into a queue of STREAM_QUEUE: the
    runner's reads and the client's writes overlap, within that bound."""
    queue: asyncio.Queue[RunnerResponse | BaseException | None] = asyncio.Queue(STREAM_QUEUE)

    async def read() -> None:
        try:
            async for response in responses:
                await queue.put(response)
            await queue.put(None)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - handed to the taker, which raises it
            await queue.put(e)
        finally:
            await responses.aclose()

    reader = asyncio.ensure_future(read())
    try:
        while (item := await queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
