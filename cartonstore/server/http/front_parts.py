"""What the daemon's front (front.py, its connections; front_server.py, its
listening sockets) share: the states of a connection, the sizes it works
with, what a connection needs of its server, and the small pure helpers of
an answer. Below both, so that neither imports the other's module to name
them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from cartonstore.server.calls.access import TcpAccess
from cartonstore.server.calls.bodies import BodyBudget
from cartonstore.server.inference import InferAnswer, arena_slot_for
from cartonstore.server.tensors.arena import ArenaSlot
from cartonstore.v2.http1 import RequestHead

from .routes import NativeRoute

if TYPE_CHECKING:
    from cartonstore.server.models.metrics import Metrics
    from cartonstore.server.models.service import ModelService

RECV_CHUNK = 256 * 1024
LINGER = 5.0    # after refusing a body too big to take: seconds spent dropping it, so the client reads the 413
MAX_PENDING = 256 * 1024   # pipelined bytes held while a request is answered; reading pauses past it

class Mode:
    """What a connection is doing; each mode says where received bytes go.
    Plain ints, compared on every read."""

    HEAD, BODY, BUSY, RELAY_BODY, RELAY_WAIT, DISCARD, HANDED, CLOSED = range(8)


class ClientGone(Exception):
    """The client closed its connection before its request was whole."""


class Front(Protocol):
    """What a connection uses of the server that accepted it (FrontServer)."""

    service: ModelService
    access: TcpAccess
    metrics: Metrics
    access_log: bool
    aiohttp_server: web.Server
    max_request_size: int
    budget: BodyBudget
    scratch: memoryview
    connections: set
    closing: bool

    def track(self, task: asyncio.Task[None]) -> None: ...


def with_length(answer: InferAnswer) -> list[tuple[str, str]]:
    # Headers come whitelisted (a runner's, runners.settings.FORWARDED_RESPONSE_HEADERS) or are the daemon's own.
    return [*answer.headers.items(), ("Content-Length", str(answer.size))]


def arena_slot(route: NativeRoute, model: Any, head: RequestHead, coding: str, length: int) -> ArenaSlot | None:
    """A slot for a big binary infer body and its outputs (as many bytes
    again) in the model's own arena, when its runners map it and one is free."""
    if not route.arena or coding != "identity" or "inference-header-content-length" not in head.headers:
        return None
    return arena_slot_for(model, length)


def release_when_sent(slot: ArenaSlot, transport: asyncio.Transport, gone: Callable[[], bool],
                      track: Callable[[asyncio.Task[None]], None]) -> None:
    """Release ``slot`` once ``transport`` holds none of its bytes: at once
    when the socket took the whole answer (or the connection is ``gone``),
    else when it drains."""
    if gone() or not transport.get_write_buffer_size():
        slot.release()
        return

    async def when_drained() -> None:
        delay = 0.001
        try:
            while not gone() and transport.get_write_buffer_size():
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.05)
        finally:
            slot.release()
    track(asyncio.get_running_loop().create_task(when_drained()))


def error_answer(status: int, message: str, extra: dict[str, str] | None = None,
                 details: dict | None = None) -> InferAnswer:
    """{"error": message, **details}, as every error answer of the API is shaped."""
    return InferAnswer(status, {"Content-Type": "application/json; charset=utf-8", **(extra or {})},
                       json.dumps({**(details or {}), "error": message}).encode(), message)
