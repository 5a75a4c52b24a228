"""Triton's system shared-memory extension, as its protocol defines it:

    GET  /v2/systemsharedmemory[/region/{name}]/status
    POST /v2/systemsharedmemory/region/{name}/register   {"key", "offset", "byte_size"}
    POST /v2/systemsharedmemory[/region/{name}]/unregister   (empty body)

Every caller sees and changes only its own regions (shm_regions.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from cartonstore.errors import InvalidInput
from cartonstore.server.calls.extensions import tell_runners
from cartonstore.server.tensors.shm_regions import Peer, ShmRegions, peer_of

from .bodies import request_body
from .context import body_json, svc

PREFIX = "/v2/systemsharedmemory"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _registry(request: web.Request) -> ShmRegions:
    return svc(request).shm_regions


def _peer(request: web.Request) -> Peer:
    """Who asks, read before any await: a connection gone meanwhile has no
    socket left to tell, and must not be taken for a TCP caller."""
    if request.transport is None:
        raise InvalidInput("the connection closed before its request was read")
    return peer_of(request.transport)


async def status(request: web.Request) -> web.Response:
    regions = _registry(request).status(_peer(request), request.match_info.get("name"))
    return web.json_response(regions)


async def register(request: web.Request) -> web.Response:
    peer = _peer(request)
    doc = await body_json(request)
    _registry(request).register(peer, request.match_info["name"], doc)
    return web.Response(status=200)


async def empty_unregister_body(request: web.Request) -> None:
    """Triton's unregister requests name the region in the URL, nothing in the body."""
    if (await request_body(request)).strip():
        raise InvalidInput("an unregister request has an empty body (the region is named in the URL)")


async def unregister(request: web.Request) -> web.Response:
    peer = _peer(request)
    await empty_unregister_body(request)
    gone = _registry(request).unregister(peer, request.match_info.get("name"))
    tell_runners(gone)
    return web.Response(status=200)


def add_region_routes(router: web.UrlDispatcher, prefix: str, status: Handler, register: Handler,
                      unregister: Handler) -> None:
    """The routes of a Triton shared-memory extension under ``prefix``."""
    router.add_get(prefix + "/status", status)
    router.add_get(prefix + "/region/{name}/status", status)
    router.add_post(prefix + "/region/{name}/register", register)
    router.add_post(prefix + "/unregister", unregister)
    router.add_post(prefix + "/region/{name}/unregister", unregister)


def add_routes(router: web.UrlDispatcher) -> None:
    add_region_routes(router, PREFIX, status, register, unregister)
