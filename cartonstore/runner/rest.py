"""The runner's KServe v2 REST routes, served on its Unix socket by
http_server.py.

Routes: GET /v2, /v2/health/live, /v2/health/ready,
/v2/models/{name}[/versions/{v}] (metadata), .../ready, .../stats,
POST .../infer, POST .../infer_stream (a decoupled model's responses,
model_stream.py), and Triton's system shared-memory extension
(/v2/systemsharedmemory/..., shm.py). Each request is answered in the
server's thread for its connection: an infer runs the model there, at most
max_concurrency at once, while other connections' threads keep answering
health checks.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from cartonstore.errors import InvalidInput
from cartonstore.format.dtypes import tensor_metadata
from cartonstore.v2 import json_codec
from cartonstore.v2.framing import HEADER_LENGTH
from cartonstore.v2.framing import header_length as header_length_of
from cartonstore.v2.statistics import InferStatistics, RequestTiming, statistics_answer

from .builtin_runners import metadata_platform
from .context import Model, RunnerContext
from .http_server import Request, Response, error_response
from .model_call import ModelFailed, decode_request, run_and_encode
from .model_stream import stream_call, stream_frames
from .protocol import ARENA_EXTENSION, DECOUPLED_EXTENSION, TIMING_HEADER, timing_header
from .shm import MappedRegions

if TYPE_CHECKING:
    import numpy as np

    from cartonstore.v2.wire_types import InferRequest

_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/stats|/infer_stream|/infer)?")
_SHM = re.compile(r"/v2/systemsharedmemory(?:/region/([^/]+))?/(status|register|unregister)")


class RunnerState:
    """What the routes share: the model, the slots it runs in, the counters."""

    def __init__(self, model: Model, ctx: RunnerContext, max_concurrency: int = 1) -> None:
        self.model = model
        self.ctx = ctx
        self.model_slots = threading.BoundedSemaphore(max_concurrency)
        self.stats = InferStatistics()
        self.regions = MappedRegions()
        self.arena = self.regions.adopt_arena()


def _json(doc: Any, status: int = 200) -> Response:
    return Response(status, {"Content-Type": "application/json"}, [json_codec.dumps(doc)])


def handle(state: RunnerState, request: Request) -> Response:
    """The answer to one request (never raises for a bad one)."""
    try:
        route = _route(state, request)
        if route is None:
            return error_response(404, f"no route {request.method} {request.path}")
        method, answer = route
        if request.method != method:
            response = error_response(405, f"{request.path} takes {method}, not {request.method}")
            response.headers["Allow"] = method
            return response
        return answer()
    except InvalidInput as exc:   # the shared-memory routes' refusals
        return error_response(400, exc.message)


def _route(state: RunnerState, request: Request) -> tuple[str, Callable[[], Response]] | None:
    """(the method the path takes, what answers it), or None for an unknown path."""
    path = request.path
    if path == "/v2":
        return "GET", lambda: _server_metadata(state)
    if path in ("/v2/health/live", "/v2/health/ready"):
        return "GET", lambda: _json({"live": True}) if path.endswith("live") else _ready()
    if (model := _MODEL.fullmatch(path)) is not None:
        wrong = _not_this_model(state, unquote(model[1]), None if model[2] is None else unquote(model[2]))
        what = model[3]
        if wrong is not None:
            return ("POST" if what in ("/infer", "/infer_stream") else "GET"), lambda: wrong
        if what == "/infer_stream":
            return "POST", lambda: _infer_stream(state, request)
        if what == "/infer":
            return "POST", lambda: _infer(state, request)
        if what == "/ready":
            return "GET", lambda: _ready()
        if what == "/stats":
            return "GET", lambda: _json(statistics_answer([state.stats.model_stats(state.ctx.name,
                                                                                   state.ctx.version)]))
        return "GET", lambda: _metadata(state.ctx)
    if (shm := _SHM.fullmatch(path)) is not None:
        region, action = None if shm[1] is None else unquote(shm[1]), shm[2]
        if action == "status":
            return "GET", lambda: _json(state.regions.status(region))
        if action == "unregister":
            return "POST", lambda: _done(state.regions.unregister(region))  # type: ignore[func-returns-value]  # None: done
        if region is not None:
            return "POST", lambda: _done(state.regions.register(region, _body_json(request)))  # type: ignore[func-returns-value]  # None: done
    return None


def _done(_: None) -> Response:
    return Response(200, {})


def _body_json(request: Request) -> Any:
    try:
        return json_codec.loads(bytes(request.body))
    except ValueError as exc:
        raise InvalidInput(f"the register request is not JSON: {exc}") from None


def _not_this_model(state: RunnerState, name: str, version: str | None) -> Response | None:
    ctx = state.ctx
    if name == ctx.name and (version is None or version == ctx.version):
        return None
    wanted = name if version is None else f"{name} version {version}"
    return error_response(404, f"this runner serves model {ctx.name!r} version {ctx.version!r}, not {wanted}")


def _server_metadata(state: RunnerState) -> Response:
    extensions = ["binary_tensor_data", "statistics", "system_shared_memory"]
    if state.arena:
        extensions.append(ARENA_EXTENSION)
    if stream_call(state.model) is not None:
        extensions.append(DECOUPLED_EXTENSION)
    return _json({"name": "cartonstore-runner", "extensions": extensions})


def _ready() -> Response:
    # once stopping, the server answers 503 itself (http_server.py): a request here is being served
    return _json({"ready": True})


def _metadata(ctx: RunnerContext) -> Response:
    return _json({
        "name": ctx.name,
        "versions": [ctx.version],
        "platform": metadata_platform(ctx.runner_name) if ctx.runner_name else "cartonstore",
        "inputs": tensor_metadata(ctx.inputs),
        "outputs": tensor_metadata(ctx.outputs),
    })


def _infer(state: RunnerState, request: Request) -> Response:
    started = request.started_ns or time.monotonic_ns()   # from its head: the body's receiving counts
    timing = RequestTiming()
    decoded_request = _decoded(state, request, started)
    if isinstance(decoded_request, Response):
        return decoded_request
    req, inputs = decoded_request
    decoded = time.monotonic_ns()
    timing.input_ns = decoded - started
    try:
        with state.model_slots:   # the time waiting here is the request's queue time
            parts, out_header_length = run_and_encode(state.model, state.ctx, req, inputs, timing, decoded,
                                                      state.regions)
    except InvalidInput as exc:   # an output that does not fit its shared memory, a region gone meanwhile
        return _failed(state, started, 400, exc.message)
    except ModelFailed as exc:
        return _failed(state, started, 500, str(exc))
    except Exception as exc:  # noqa: BLE001 - a bug here must not take the runner down either
        return _failed(state, started, 500, f"{type(exc).__name__}: {exc}")
    # counted before the answer is written: a client that reads it and asks
    # for statistics at once finds this request in them
    state.stats.record_success(time.monotonic_ns() - started, timing)
    headers = {TIMING_HEADER: timing_header(timing)}
    if out_header_length is None:
        headers["Content-Type"] = "application/json"
    else:
        headers["Content-Type"] = "application/octet-stream"
        headers[HEADER_LENGTH] = str(out_header_length)
    return Response(200, headers, parts)


def _decoded(state: RunnerState, request: Request,
             started: int) -> tuple[InferRequest, dict[str, np.ndarray]] | Response:
    """The request and its inputs, or the 400 that answers a malformed one."""
    try:
        header_length = header_length_of(request.headers.get(HEADER_LENGTH.lower()))
        return decode_request(request.body, header_length, state.ctx, state.regions)
    except InvalidInput as exc:
        return _failed(state, started, 400, exc.message)
    except Exception as exc:  # noqa: BLE001 - a malformed request must never take the runner down
        return _failed(state, started, 400, f"{type(exc).__name__}: {exc}")


def _failed(state: RunnerState, started: int, status: int, message: str) -> Response:
    state.stats.record_failure(time.monotonic_ns() - started)
    return error_response(status, message)


def _infer_stream(state: RunnerState, request: Request) -> Response:
    """A decoupled model's responses to one request, as frames
    (protocol.py, section 12); a request it cannot take is an ordinary
    error answer."""
    call = stream_call(state.model)
    if call is None:
        return error_response(400, f"model {state.ctx.name!r} is not decoupled: it answers one response per "
                                   "request (POST .../infer)")
    started = request.started_ns or time.monotonic_ns()
    decoded_request = _decoded(state, request, started)
    if isinstance(decoded_request, Response):
        return decoded_request
    req, inputs = decoded_request

    def frames() -> Iterator[list[bytes | memoryview]]:
        with state.model_slots:   # the model is busy until its last response is written
            yield from stream_frames(call, state.ctx, req, inputs)
        state.stats.record_success(time.monotonic_ns() - started, RequestTiming())

    return Response(200, {"Content-Type": "application/octet-stream"}, stream=frames())
