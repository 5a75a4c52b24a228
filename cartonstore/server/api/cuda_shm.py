"""Triton's CUDA shared-memory extension, as its protocol defines it:

    GET  /v2/cudasharedmemory[/region/{name}]/status
    POST /v2/cudasharedmemory/region/{name}/register   {"raw_handle": {"b64"}, "device_id", "byte_size"}
    POST /v2/cudasharedmemory[/region/{name}]/unregister   (empty body)

What each answers: server/calls/extensions.py.
"""

from __future__ import annotations

from aiohttp import web

from cartonstore.errors import InvalidInput
from cartonstore.server.calls.extensions import cuda_register_problem, cuda_status_answer

from .context import body_json, svc
from .shm import add_region_routes, empty_unregister_body

PREFIX = "/v2/cudasharedmemory"


async def status(request: web.Request) -> web.Response:
    return web.json_response(cuda_status_answer(request.match_info.get("name")))


async def register(request: web.Request) -> web.Response:
    doc = await body_json(request)
    name = request.match_info["name"]
    raise InvalidInput(cuda_register_problem(doc, name, svc(request).runner_host.config.devices), subject=name)


async def unregister(request: web.Request) -> web.Response:
    await empty_unregister_body(request)
    return web.Response(status=200)


def add_routes(router: web.UrlDispatcher) -> None:
    add_region_routes(router, PREFIX, status, register, unregister)
