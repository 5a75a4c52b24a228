"""The requests the daemon's front answers itself, without aiohttp: the
ones loaders and clients send in a loop (infer, and take / renew / release
a lease). Each is a NativeRoute: what to check before the body is read,
and how to answer once it is. Everything else goes to aiohttp (relay.py).

Why leases too: through the relay, every request costs a fresh aiohttp
request handler on top of the front's own parsing, which took the lease
API from 1.06x to 0.59x a bare aiohttp server's throughput
(tests/bench/bench_daemon.py).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cartonstore.server.calls.bodies import body_object
from cartonstore.server.calls.leases import release, renew, take
from cartonstore.server.inference import InferAnswer, InferCall, infer, serving_or_loadable
from cartonstore.v2 import json_codec

if TYPE_CHECKING:
    from cartonstore.server.models.service import ModelService
    from cartonstore.server.tensors.arena import ArenaSlot
    from cartonstore.server.tensors.shm_regions import Peer
    from cartonstore.v2.http1 import RequestHead

_INFER = re.compile(r"^/v2/models/([^/%?]+)(?:/versions/([^/%?]+))?/infer$")
_LEASE = re.compile(r"^/v1/leases(?:/([^/%?]+)(/renew)?)?$")
JSON = {"Content-Type": "application/json; charset=utf-8"}

# (service, head, peer, what check_first returned, decoded body, the arena slot it is in) -> the answer
Produce = Callable[["ModelService", "RequestHead", "Peer", Any, "bytes | bytearray | memoryview", "ArenaSlot | None"],
                   Awaitable[InferAnswer]]


@dataclass(frozen=True)
class NativeRoute:
    label: str                                            # the route as metrics and logs name it
    check_first: Callable[[ModelService], Any]           # refuses before the body is read (an unknown model)
    produce: Produce
    arena: bool = False                                  # a big binary body may be received into the arena


def native_route(head: RequestHead) -> NativeRoute | None:
    """The route the front answers for ``head``, or None (aiohttp's)."""
    path, method = head.path, head.method
    if method == "POST":
        infer = _INFER.match(path)
        if infer is not None:
            return _infer_route(infer[1], infer[2])
    lease = _LEASE.match(path)
    if lease is None:
        return None
    lease_id, renewing = lease[1], lease[2] is not None
    if lease_id is None:
        return _TAKE if method == "POST" else None
    if renewing:
        return _renew_route(lease_id) if method == "POST" else None
    return _release_route(lease_id) if method == "DELETE" else None


def _infer_route(name: str, version: str | None) -> NativeRoute:
    async def produce(service: ModelService, head: RequestHead, peer: Peer, model: Any,
                      body: bytes | bytearray | memoryview, slot: ArenaSlot | None) -> InferAnswer:
        call = InferCall(name, version, peer, body, head.headers.get("inference-header-content-length"),
                         head.headers.get("accept-encoding", ""), slot)
        return await infer(service, model, call)
    label = "/v2/models/{name}/infer" if version is None else "/v2/models/{name}/versions/{version}/infer"
    return NativeRoute(label, lambda service: serving_or_loadable(service, name, version), produce, arena=True)


def _json_answer(doc: dict[str, Any]) -> InferAnswer:
    return InferAnswer(200, dict(JSON), json_codec.dumps(doc))


def _nothing_first(service: ModelService) -> None:
    return None


async def _take(service: ModelService, head: RequestHead, peer: Peer, _: Any, body: bytes | bytearray | memoryview,
                _slot: object) -> InferAnswer:
    return _json_answer(await take(service, await body_object(body), peer))


_TAKE = NativeRoute("/v1/leases", _nothing_first, _take)


def _renew_route(lease_id: str) -> NativeRoute:
    async def produce(service: ModelService, head: RequestHead, peer: Peer, _: Any,
                      body: bytes | bytearray | memoryview, _slot: object) -> InferAnswer:
        return _json_answer(await renew(service, lease_id, await body_object(body)))
    return NativeRoute("/v1/leases/{lease}/renew", _nothing_first, produce)


def _release_route(lease_id: str) -> NativeRoute:
    async def produce(service: ModelService, head: RequestHead, peer: Peer, _: Any,
                      body: bytes | bytearray | memoryview, _slot: object) -> InferAnswer:
        return _json_answer(await release(service, lease_id))
    return NativeRoute("/v1/leases/{lease}", _nothing_first, produce)
