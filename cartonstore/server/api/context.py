"""What the routes share, so that no route module imports the app module
that imports it: the application's keys (the model service, the metrics,
settings of the front) and the small readers of a request every route
uses. ``app.py`` fills the keys when it builds the application; a route
reads ``request.app[SERVICE]`` (``svc``), never a module global."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from cartonstore.errors import InvalidInput
from cartonstore.server.calls.access import TcpAccess
from cartonstore.server.calls.bodies import body_object
from cartonstore.server.models.metrics import Metrics
from cartonstore.server.models.service import ModelService

from .bodies import request_body

SERVICE: web.AppKey[ModelService] = web.AppKey("service", ModelService)
METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
ACCESS_LOG: web.AppKey[bool] = web.AppKey("access_log", bool)
TCP_ACCESS: web.AppKey[TcpAccess] = web.AppKey("tcp_access", TcpAccess)   # who may call what over TCP


async def body_json(request: web.Request) -> dict[str, Any]:
    """The JSON object in the body; {} for an empty body. No Content-Type needed."""
    return await body_object(await request_body(request))


def parameters(body: dict[str, Any]) -> dict[str, Any]:
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInput(f"'parameters' must be an object, got {type(params).__name__}")
    return params


def svc(request: web.Request) -> ModelService:
    return request.app[SERVICE]
