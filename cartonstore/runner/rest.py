"""The runner's KServe v2 REST app (aiohttp), served on its Unix socket.

Routes: GET /v2, /v2/health/live, /v2/health/ready,
/v2/models/{name}[/versions/{v}] (metadata), .../ready, .../stats,
POST .../infer, and Triton's system shared-memory extension
(/v2/systemsharedmemory/..., shm.py). The model runs in worker threads so the event loop keeps
answering health checks while it computes.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from cartonstore.errors import InvalidInput
from cartonstore.format.dtypes import tensor_metadata
from cartonstore.v2.framing import HEADER_LENGTH
from cartonstore.v2.framing import header_length as header_length_of
from cartonstore.v2.shm_params import ARENA_EXTENSION, REGION
from cartonstore.v2.statistics import TIMING_HEADER, InferStatistics, RequestTiming, statistics_answer

from .context import Model, RunnerContext
from .infer import (
    BodyParts,
    ModelFailed,
    decode_request,
    run_and_encode,
)
from .shm import MappedRegions

# Big binary outputs are written in slices so the transport never holds a
# second full copy of a tensor in its buffer.
_WRITE_SLICE = 4 * 1024 * 1024
DECODE_IN_THREAD_FROM = 256 * 1024
SHM_MARK = REGION.encode()   # a body naming shared memory may have big BYTES to walk there
# The daemon bounds request sizes; a runner used directly takes what it is sent.
_MAX_BODY = 2**62


class RunnerState:
    """What the handlers share: the model's worker threads, the counters,
    and the count of infer requests in flight (SIGTERM waits for it)."""

    def __init__(self, model: Model, ctx: RunnerContext, max_concurrency: int = 1) -> None:
        self.model = model
        self.ctx = ctx
        self.executor = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="infer")
        self.stats = InferStatistics()
        self.regions = MappedRegions()
        self.arena = self.regions.adopt_arena()
        self.draining = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def begin(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def end(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()


_STATE = web.AppKey("runner_state", RunnerState)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own 404/405/413 answers, and refusals, as {"error": ...}."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.reason if exc.text is None else exc.text)
    except InvalidInput as exc:   # the shared-memory routes' refusals
        return _error(400, exc.message)


def _state_for(request: web.Request) -> RunnerState:
    """The state, once the URL's model name and version are this runner's."""
    state = request.app[_STATE]
    name = request.match_info["name"]
    version = request.match_info.get("version")
    if name != state.ctx.name or (version is not None and version != state.ctx.version):
        wanted = name if version is None else f"{name} version {version}"
        raise web.HTTPNotFound(
            text=f"this runner serves model {state.ctx.name!r} version {state.ctx.version!r}, not {wanted}"
        )
    return state


async def _server_metadata(request: web.Request) -> web.Response:
    extensions = ["binary_tensor_data", "statistics", "system_shared_memory"]
    if request.app[_STATE].arena:
        extensions.append(ARENA_EXTENSION)
    return web.json_response({"name": "cartonstore-runner", "extensions": extensions})


async def _live(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def _ready(request: web.Request) -> web.Response:
    if request.app[_STATE].draining:
        return _error(503, "the runner is stopping")
    return web.json_response({"ready": True})


async def _model_ready(request: web.Request) -> web.Response:
    _state_for(request)
    return await _ready(request)


async def _metadata(request: web.Request) -> web.Response:
    ctx = _state_for(request).ctx
    return web.json_response(
        {
            "name": ctx.name,
            "versions": [ctx.version],
            "platform": f"carton_{ctx.runner_name}" if ctx.runner_name else "cartonstore",
            "inputs": tensor_metadata(ctx.inputs),
            "outputs": tensor_metadata(ctx.outputs),
        }
    )


async def _stats(request: web.Request) -> web.Response:
    state = _state_for(request)
    return web.json_response(statistics_answer([state.stats.model_stats(state.ctx.name, state.ctx.version)]))


async def _read_body(request: web.Request) -> memoryview:
    """The body in one writable buffer, filled once: arrays decoded from it
    are views that the model may modify in place (Carton hands models
    writable arrays)."""
    length = request.content_length
    if length is None:  # chunked: rare, and its size is unknown up front
        return memoryview(bytearray(await request.read()))
    buffer = bytearray(length)
    view = memoryview(buffer)
    filled = 0
    while filled < length:
        chunk = await request.content.readany()
        if not chunk:
            break
        end = filled + len(chunk)
        if end > length:
            raise InvalidInput(f"the body is longer than its Content-Length {length}")
        view[filled:end] = chunk
        filled = end
    if filled != length:
        raise InvalidInput(f"the body ended after {filled} of its {length} bytes")
    return view


async def _infer(request: web.Request) -> web.StreamResponse:
    state = _state_for(request)
    if state.draining:
        return _error(503, "the runner is stopping")
    started = time.monotonic_ns()
    state.begin()
    timing = RequestTiming()
    try:
        try:
            body = await _read_body(request)
            header_length = header_length_of(request.headers.get(HEADER_LENGTH))
            decoding = time.monotonic_ns()
            if len(body) < DECODE_IN_THREAD_FROM and SHM_MARK not in body:
                req, inputs = decode_request(body, header_length, state.ctx, state.regions)
            else:  # JSON or BYTES of this size (or in shared memory) would hold the loop for a while
                req, inputs = await asyncio.to_thread(decode_request, body, header_length, state.ctx,
                                                      state.regions)
            timing.input_ns = time.monotonic_ns() - decoding
        except InvalidInput as exc:
            return _failed(state, started, 400, exc.message)
        except Exception as exc:  # noqa: BLE001 - a malformed request must never take the runner down
            return _failed(state, started, 400, f"{type(exc).__name__}: {exc}")
        loop = asyncio.get_running_loop()
        try:
            parts, out_header_length = await loop.run_in_executor(
                state.executor, run_and_encode, state.model, state.ctx, req, inputs, timing,
                time.monotonic_ns(), state.regions,
            )
        except InvalidInput as exc:   # an output that does not fit its shared memory, a region gone meanwhile
            return _failed(state, started, 400, exc.message)
        except ModelFailed as exc:
            return _failed(state, started, 500, str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug here must not take the runner down either
            return _failed(state, started, 500, f"{type(exc).__name__}: {exc}")
        # counted before the answer is written: a client that reads it and asks
        # for statistics at once finds this request in them
        state.stats.record_success(time.monotonic_ns() - started, timing)
        return await _write_parts(request, parts, out_header_length, timing)
    finally:
        state.end()


def _failed(state: RunnerState, started: int, status: int, message: str) -> web.Response:
    state.stats.record_failure(time.monotonic_ns() - started)
    return _error(status, message)


async def _write_parts(request: web.Request, parts: BodyParts, header_length: int | None,
                       timing: RequestTiming) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers={TIMING_HEADER: timing.header()})
    if header_length is None:
        response.content_type = "application/json"
    else:
        response.content_type = "application/octet-stream"
        response.headers[HEADER_LENGTH] = str(header_length)
    response.content_length = sum(memoryview(part).nbytes for part in parts)
    await response.prepare(request)
    for part in parts:
        view = memoryview(part).cast("B")
        for offset in range(0, len(view), _WRITE_SLICE):
            await response.write(view[offset : offset + _WRITE_SLICE])
    await response.write_eof()
    return response


async def _shm_status(request: web.Request) -> web.Response:
    return web.json_response(request.app[_STATE].regions.status(request.match_info.get("name")))


async def _shm_register(request: web.Request) -> web.Response:
    try:
        doc = await request.json()
    except ValueError as exc:
        raise InvalidInput(f"the register request is not JSON: {exc}") from None
    request.app[_STATE].regions.register(request.match_info["name"], doc)
    return web.Response(status=200)


async def _shm_unregister(request: web.Request) -> web.Response:
    request.app[_STATE].regions.unregister(request.match_info.get("name"))
    return web.Response(status=200)


def build_app(state: RunnerState) -> web.Application:
    app = web.Application(client_max_size=_MAX_BODY, middlewares=[_json_errors])
    app[_STATE] = state
    app.router.add_get("/v2", _server_metadata)
    app.router.add_get("/v2/health/live", _live)
    app.router.add_get("/v2/health/ready", _ready)
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        app.router.add_get(prefix, _metadata)
        app.router.add_get(prefix + "/ready", _model_ready)
        app.router.add_get(prefix + "/stats", _stats)
        app.router.add_post(prefix + "/infer", _infer)
    shm = "/v2/systemsharedmemory"
    app.router.add_get(shm + "/status", _shm_status)
    app.router.add_get(shm + "/region/{name}/status", _shm_status)
    app.router.add_post(shm + "/region/{name}/register", _shm_register)
    app.router.add_post(shm + "/unregister", _shm_unregister)
    app.router.add_post(shm + "/region/{name}/unregister", _shm_unregister)
    return app
