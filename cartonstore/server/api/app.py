"""The HTTP API: KServe v2 / Triton routes, leases, blobs, metrics.

A thin layer over ModelService: parse the request, call one method, shape
the answer. Errors become JSON {"error": ...} with the status of their
category, from one table. Request bodies are parsed here whatever their
Content-Type; an empty body means "no options".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from cartonstore import __version__
from cartonstore.errors import CartonStoreError, InvalidInput
from cartonstore.server.calls import leases as lease_api
from cartonstore.server.calls.access import TcpAccess
from cartonstore.server.calls.extensions import EXTENSIONS
from cartonstore.server.calls.outcome import failure, record_request
from cartonstore.server.models.loaded_self_tests import SelfTestFailed
from cartonstore.server.models.metrics import CONTENT_TYPE, Metrics
from cartonstore.server.models.service import ModelService
from cartonstore.server.tensors.shm_regions import peer_of
from cartonstore.store.gc.plan import GcPolicy
from cartonstore.store.metadata.names import check_model_ref

from . import cuda_shm, model_info
from . import examples as examples_api
from . import generate as generate_api
from . import selftest as selftest_api
from . import shm as shm_api
from .blobs import serve_blob
from .bodies import release_body
from .context import ACCESS_LOG, METRICS, SERVICE, TCP_ACCESS, body_json, parameters, svc
from .infer import infer
from .responses import ERROR_TEXT, POLLED, error

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    try:
        if request.transport is None:
            raise InvalidInput("the connection closed before its request was read")
        if not peer_of(request.transport).unix:
            request.app[TCP_ACCESS].check(request.path, request.headers.get("Authorization"),
                                          bool(request.transport.get_extra_info("peercert")))
        if _names_a_model(request):
            check_model_ref(request.match_info["name"], request.match_info.get("version"))
        response = await handler(request)
    except web.HTTPException as e:
        response = error(e.status, e.reason or "error") if e.status >= 400 else e
    except Exception as e:  # noqa: BLE001 - failure() logs what was not expected
        status, message, extra = failure(e, request.method, request.path)
        response = error(status, message, details=e.details if isinstance(e, CartonStoreError) else None)
        response.headers.update(extra)
    finally:
        release_body(request)   # what its body held of server.max_buffered
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    record_request(request.app[METRICS], request.app[ACCESS_LOG], route, request.method, request.path_qs,
                   response.status, response.get(ERROR_TEXT) or response.reason, bool(response.get(POLLED)), started)
    return response


def _names_a_model(request: web.Request) -> bool:
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical.startswith(("/v2/models/{name}", "/v2/repository/models/{name}"))


# -- health and metadata --------------------------------------------------------


async def live(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def ready(request: web.Request) -> web.Response:
    if svc(request).ready:
        return web.Response(status=200)
    return error(400, "the daemon is not ready (starting or shutting down)", polled=True)


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response({"name": "cartonstore", "version": __version__, "extensions": EXTENSIONS})


# -- repository ---------------------------------------------------------------


async def repository_index(request: web.Request) -> web.Response:
    body = await body_json(request)
    ready_only = body.get("ready", False)
    if not isinstance(ready_only, bool):
        raise InvalidInput(f"'ready' must be a boolean, got {type(ready_only).__name__}")
    return web.json_response(await svc(request).index(ready_only))


async def load(request: web.Request) -> web.Response:
    peer = peer_of(request.transport)   # before an await: a connection gone meanwhile has no socket to ask
    params = parameters(await body_json(request))
    try:
        model = await svc(request).load(request.match_info["name"], params, peer=peer)
    except SelfTestFailed as e:   # the report goes with the 400
        response = web.json_response({"error": str(e), "selftest": e.report.as_json()}, status=400)
        response[ERROR_TEXT] = str(e)
        return response
    # Triton answers {}; a model loaded as files only says why it runs no runner
    return web.json_response({"reason": model.reason} if model is not None and model.reason else {})


async def unload(request: web.Request) -> web.Response:
    parameters(await body_json(request))
    await svc(request).unload(request.match_info["name"])
    return web.json_response({})


async def model_metadata(request: web.Request) -> web.Response:
    name, version = request.match_info["name"], request.match_info.get("version")
    return web.json_response(await svc(request).metadata(name, version))


async def model_ready(request: web.Request) -> web.Response:
    name, version = request.match_info["name"], request.match_info.get("version")
    if svc(request).loaded(name, version) is not None:
        return web.Response(status=200)
    model = svc(request).models.get(name)
    reason = model.as_index_row()["reason"] if model is not None else ""
    why = f": {reason}" if reason else ""
    return error(400, f"model {name!r}{' version ' + version if version else ''} is not ready{why}", polled=True)


# -- leases ---------------------------------------------------------------------


async def take_lease(request: web.Request) -> web.Response:
    peer = peer_of(request.transport)
    return web.json_response(await lease_api.take(svc(request), await body_json(request), peer))


async def renew_lease(request: web.Request) -> web.Response:
    body = await body_json(request)
    return web.json_response(await lease_api.renew(svc(request), request.match_info["lease"], body))


async def release_lease(request: web.Request) -> web.Response:
    return web.json_response(await lease_api.release(svc(request), request.match_info["lease"]))


async def gc(request: web.Request) -> web.Response:
    body = await body_json(request)
    policy = gc_policy_from(body)
    report = await svc(request).collect(policy)
    return web.json_response(report.as_dict())


def gc_policy_from(body: dict[str, Any]) -> GcPolicy:
    def number(key: str, default: float | None) -> Any:  # a JSON number, or default
        value = body.get(key, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise InvalidInput(f"'{key}' must be a number >= 0, got {value!r}")
        return value

    flags = {key: body.get(key, False) for key in ("dry_run", "forget_unrecoverable")}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise InvalidInput(f"'{key}' must be a boolean")
    return GcPolicy(max_size=number("max_size", None), min_free=number("min_free", None),
                    grace=number("grace", 3600.0), **flags)


# -- blobs and metrics ------------------------------------------------------------


async def blob(request: web.Request) -> web.StreamResponse:
    service = svc(request)
    return await serve_blob(request, service.store, request.app[METRICS], service.puller.fetcher.peers)


async def metrics(request: web.Request) -> web.Response:
    # Rendering reads the index (store size, leases): off the event loop.
    body = await asyncio.to_thread(request.app[METRICS].render)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def node(request: web.Request) -> web.Response:
    return web.json_response(await asyncio.to_thread(svc(request).node_status))


async def not_found(request: web.Request) -> web.Response:
    return error(404, f"no such endpoint: {request.method} {request.path}")


def build_app(service: ModelService, metrics_: Metrics, *, max_request_size: int = 256 << 20,
              access_log: bool = False, tcp_access: TcpAccess | None = None) -> web.Application:
    """access_log: one info line per request answered (errors always get one);
    tcp_access: what callers over TCP must show (access.py)."""
    app = web.Application(middlewares=[errors_and_metrics], client_max_size=max_request_size)
    app[SERVICE] = service
    app[METRICS] = metrics_
    app[ACCESS_LOG] = access_log
    app[TCP_ACCESS] = tcp_access or TcpAccess()
    metrics_.watch(service.live_values, service.inference_values)
    r = app.router
    r.add_get("/v2/health/live", live)
    r.add_get("/v2/health/ready", ready)
    r.add_get("/v2", server_metadata)
    r.add_post("/v2/repository/index", repository_index)
    r.add_post("/v2/repository/models/{name}/load", load)
    r.add_post("/v2/repository/models/{name}/unload", unload)
    model_info.add_routes(r)   # before the metadata routes: /v2/models/stats names no model
    r.add_get("/v2/models/{name}", model_metadata)
    r.add_get("/v2/models/{name}/versions/{version}", model_metadata)
    r.add_get("/v2/models/{name}/ready", model_ready)
    r.add_get("/v2/models/{name}/versions/{version}/ready", model_ready)
    r.add_post("/v2/models/{name}/infer", infer)
    r.add_post("/v2/models/{name}/versions/{version}/infer", infer)
    generate_api.add_routes(r)
    shm_api.add_routes(r)
    cuda_shm.add_routes(r)
    selftest_api.add_routes(r)
    examples_api.add_routes(r)
    r.add_post("/v1/leases", take_lease)
    r.add_post("/v1/leases/{lease}/renew", renew_lease)
    r.add_delete("/v1/leases/{lease}", release_lease)
    r.add_post("/v1/gc", gc)
    r.add_get("/v1/blobs/{digest}", blob)
    r.add_get("/v1/node", node)
    r.add_get("/metrics", metrics)
    r.add_route("*", "/{tail:.*}", not_found)
    return app
