"""One client connection of the daemon's HTTP/1.1 front (FrontServer,
listeners.py, accepts it): its requests one at a time, in order, each
answered here or by aiohttp.

Why inference does not go through aiohttp: its request and response
machinery costs ~0.25 ms of CPU per request on a 2-core VM, as much as the
whole proxy overhead the daemon may add (tests/bench/bench_infer.py). Here
an infer request is a parsed head, a body received in place into one
buffer, the inference core (server/inference/), and one write of the answer.

Any other request (and an infer request with a chunked body) is handed to
aiohttp one request at a time through a RelayTransport (relay.py), so
tritonclient's connection can load, poll readiness and infer on one
keep-alive connection, with every request taking its own path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from cartonstore.errors import CartonStoreError
from cartonstore.server.calls.access import TcpAccess
from cartonstore.server.calls.bodies import BodyBudget, Reservation, content_coding, decoded_body, too_large
from cartonstore.server.calls.outcome import failure, record_request
from cartonstore.server.inference import STREAM_ANSWER, InferAnswer, arena_slot_for, widen_send_buffer
from cartonstore.server.tensors.arena import ArenaSlot
from cartonstore.server.tensors.shm_regions import Peer, peer_of
from cartonstore.system.unfilled import unfilled_bytearray
from cartonstore.system.waiters import fail, wake
from cartonstore.v2.http1 import RequestHead, for_one_request, parse_request_head, response_head, take_head
from cartonstore.v2.http1_faults import BadHead

from .relay import RelayTransport
from .routes import NativeRoute, native_route

if TYPE_CHECKING:
    from aiohttp.web_protocol import RequestHandler

    from cartonstore.server.models.metrics import Metrics
    from cartonstore.server.models.service import ModelService
    from cartonstore.system.connection_gate import Admission

log = logging.getLogger("cartonstore.server")

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



class FrontConnection(asyncio.BufferedProtocol):
    """One client connection: requests one at a time, in order."""

    # Thousands live at once in a flood: no __dict__ each for the cyclic collector to walk.
    __slots__ = ("_big_send_buffer", "admission", "body", "body_got", "body_waiter", "close_after_discard",
                 "discard_left", "drained", "front", "head_since", "last_active", "lost", "mode", "peer", "peer_eof",
                 "pending", "relay_left", "relay_paused", "relayed", "transport", "write_paused")

    def __init__(self, front: Front, admission: Admission) -> None:
        self.front = front
        self.admission = admission          # its place among its listener's connections, given back at close
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.mode = Mode.HEAD
        self.pending = bytearray()          # received, not yet consumed: heads, pipelined requests
        self.body: memoryview | None = None  # the unfilled rest of an infer body, received in place
        self.body_got = 0
        self.body_waiter: asyncio.Future[None] | None = None
        self.relayed: RequestHandler | None = None
        self.relay_left = 0                 # body bytes aiohttp has yet to be fed
        self.discard_left = 0               # body bytes of an answered request, dropped as they come
        self.drained: asyncio.Future[None] | None = None
        self.write_paused = False
        self.relay_paused = False           # the relayed handler was told to pause writing
        self.close_after_discard = False
        self.peer_eof = False
        self.last_active = time.monotonic()
        self.head_since: float | None = admission.accepted_at   # the awaited head's start; None: idle between
        self._big_send_buffer = False
        self.peer = Peer(None)
        self.lost = False                   # connection_lost came: the transport holds no more of our bytes

    # -- protocol callbacks -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream server makes stream transports
        self.peer = peer_of(transport)
        self.front.connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        # One buffer for every connection: each buffer_updated copies out what it keeps before returning.
        return self.body[self.body_got:] if self.mode == Mode.BODY else self.front.scratch  # type: ignore[index]  # Mode.BODY: body is set

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        if self.mode == Mode.BODY:
            self.body_got += nbytes
            if self.body_got == len(self.body):  # type: ignore[arg-type]  # Mode.BODY: body is set
                self.body, self.mode = None, Mode.BUSY
                wake(self.body_waiter)
            return
        data = self.front.scratch[:nbytes]
        if self.mode == Mode.HANDED:
            self.relayed.data_received(bytes(data))  # type: ignore[union-attr]  # Mode.HANDED: a handler is relayed to
            return
        if self.mode == Mode.RELAY_BODY:
            take = min(nbytes, self.relay_left)
            self.relay_left -= take
            if self.relay_left == 0:
                self.mode = Mode.RELAY_WAIT
            self.relayed.data_received(bytes(data[:take]))  # type: ignore[union-attr]  # Mode.RELAY_BODY: a handler is relayed to
            data = data[take:]
        elif self.mode == Mode.DISCARD:
            take = min(nbytes, self.discard_left)
            self.discard_left -= take
            if self.discard_left == 0:
                if self.close_after_discard:
                    self._close()
                    return
                self.mode = Mode.HEAD
            data = data[take:]
        if len(data):
            self.pending += data
        if self.mode == Mode.HEAD:
            self._next_request()
        elif self.mode == Mode.DISCARD or self.mode == Mode.CLOSED:
            return
        elif len(self.pending) > MAX_PENDING:
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.peer_eof = True
        if self.mode == Mode.BODY:
            fail(self.body_waiter, ClientGone())
        # Half-closed while its request is answered: keep the connection for the answer.
        return self.mode in (Mode.BUSY, Mode.RELAY_WAIT)

    def connection_lost(self, exc: Exception | None) -> None:
        self.mode = Mode.CLOSED
        self.lost = True
        self.front.connections.discard(self)
        self.admission.release()
        fail(self.body_waiter, ClientGone())
        wake(self.drained)
        if self.relayed is not None:
            handler, self.relayed = self.relayed, None
            handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.drained is None:
            self.drained = asyncio.get_running_loop().create_future()
        if self.relayed is not None and not self.relay_paused:
            self.relay_paused = True
            self.relayed.pause_writing()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.relayed is not None and self.relay_paused:
            self.relay_paused = False
            self.relayed.resume_writing()
        wake(self.drained)
        self.drained = None

    def idle(self) -> bool:
        """Between requests (a partial head is dropped at shutdown, as aiohttp did)."""
        return self.mode == Mode.HEAD

    def give_up(self, last_words: bytes) -> None:
        """End a connection too slow (or idle too long), with a last answer if any."""
        if last_words:
            self.transport.write(last_words)
        self._close()

    def _close(self) -> None:
        self.transport.close()
        self.mode = Mode.CLOSED

    def _abort(self) -> None:
        self.transport.abort()
        self.mode = Mode.CLOSED

    # -- requests ---------------------------------------------------------------

    def _next_request(self) -> None:
        """Start on the next whole request head in ``pending``, if any. A
        fault here must not leave the connection half-way: it is dropped."""
        try:
            self._start_next()
        except Exception:  # a bug: logged, and this connection ends
            log.exception("front connection failed starting a request")
            self._abort()

    def _start_next(self) -> None:
        try:
            raw = take_head(self.pending)
            if raw is None:
                if self.pending and self.head_since is None:
                    self.head_since = time.monotonic()
                return
            self.head_since = None
            head = parse_request_head(raw)
            length = head.content_length()
        except BadHead as e:
            self._refuse(e.status, str(e))
            return
        route = native_route(head) if length is not None and "upgrade" not in head.headers else None
        if route is None:
            self._relay(head, length)
            return
        self.mode = Mode.BUSY
        if length > len(self.pending):  # type: ignore[operator]  # a route: a length
            # Until _serve runs (the loop's next turn) reads would land in pending, to be
            # copied again into the body's buffer: up to MAX_PENDING of each big body.
            # _read_body resumes reading into that buffer.
            self.transport.pause_reading()
        self.front.track(asyncio.get_running_loop().create_task(self._serve(head, length, route)))  # type: ignore[arg-type]  # a length

    async def _serve(self, head: RequestHead, length: int, route: NativeRoute) -> None:
        slot: ArenaSlot | None = None
        reservation = self.front.budget.reserve()
        try:
            slot = await self._serve_in(head, length, route, reservation)
        finally:
            reservation.release()   # the body is garbage once _serve_in returned
            if slot is not None:
                release_when_sent(slot, self.transport, lambda: self.lost, self.front.track)

    async def _serve_in(self, head: RequestHead, length: int, route: NativeRoute,
                        reservation: Reservation) -> ArenaSlot | None:
        """Answer one request; returns the arena slot its body and answer
        used, to be released once the answer has left. A body outside the
        arena is reserved from the daemon's budget before it is read."""
        started = time.perf_counter()
        unread = length
        slot = None
        try:
            if not self.peer.unix:   # who may call what over TCP (calls/access.py), before anything else
                self.front.access.check(head.path, head.headers.get("authorization"),
                                        bool(self.transport.get_extra_info("peercert")))
            service = self.front.service
            first = route.check_first(service)  # an unknown model is refused before its body is read
            coding = content_coding(head.headers.get("content-encoding"))
            if length > self.front.max_request_size:
                raise too_large(length, self.front.max_request_size)
            slot = arena_slot(route, first, head, coding, length)
            if slot is None:
                reservation.grow(length)
            if head.headers.get("expect", "").lower() == "100-continue":
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            raw = await self._read_body(length, slot)
            unread = 0
            body = await decoded_body(raw, coding, self.front.max_request_size, reservation)
            answer = await route.produce(service, head, self.peer, first, body, slot)
        except ClientGone:
            return slot   # nothing reached the runner, and no one is left to answer
        except Exception as e:  # noqa: BLE001 - failure() logs what was not expected
            status, message, extra = failure(e, head.method, head.path)
            answer = error_answer(status, message, extra, e.details if isinstance(e, CartonStoreError) else None)
        try:
            record_request(self.front.metrics, self.front.access_log, route.label, head.method, head.target,
                           answer.status, answer.error_text, False, started)
            await self._answer(head, answer, unread)
        except Exception:  # a bug: logged, and this connection ends
            log.exception("front connection failed answering %s %s", head.method, head.target)
            self._abort()
        return slot

    async def _read_body(self, length: int, slot: ArenaSlot | None = None) -> bytearray | memoryview:
        """The body, in one buffer (``slot``'s first bytes when given): what
        is pending, the rest received in place, its pages written as it comes."""
        out = slot.view[:length] if slot is not None else unfilled_bytearray(length)
        have = min(length, len(self.pending))
        out[:have] = self.pending[:have]
        del self.pending[:have]
        if have == length:
            return out
        self.body, self.body_got, self.mode = memoryview(out)[have:], 0, Mode.BODY
        self.body_waiter = asyncio.get_running_loop().create_future()
        self._resume_reading()
        try:
            await self.body_waiter
        finally:
            self.body_waiter = None
            self.body = None
        return out

    async def _answer(self, head: RequestHead, answer: InferAnswer, unread: int) -> None:
        if self.mode == Mode.CLOSED:
            return
        # A client told to go on (100 Continue) may not send a refused body at
        # all: only a close tells it where the next request would start.
        expected = unread and head.headers.get("expect", "").lower() == "100-continue"
        too_big = unread > self.front.max_request_size
        close = not head.keep_alive or self.front.closing or self.peer_eof or bool(expected) or too_big
        out = response_head(answer.status, with_length(answer), close=close)
        if answer.size < STREAM_ANSWER:
            self.transport.write(out + answer.joined())
        else:
            self._big_buffers()
            if len(answer.payload) < STREAM_ANSWER:
                self.transport.write(out + answer.payload)
            else:
                self.transport.write(out)
                self.transport.write(memoryview(answer.payload))
            for part in answer.tail:
                self.transport.write(part)
        if too_big and not expected and not self.peer_eof:
            self._linger(unread)
            return
        if close:
            self._close()
            return
        if self.write_paused:   # the client reads slower than it asks
            await self.drained  # type: ignore[misc]  # write_paused: a future
            if self.mode == Mode.CLOSED:
                return
        self._between_requests(unread)

    # -- requests aiohttp answers (relay.py) -------------------------------------------

    def _relay(self, head: RequestHead, length: int | None) -> None:
        """Hand this request to a fresh aiohttp handler; its answer goes
        straight to the client, and its closing the relay ends the request."""
        handler = self.front.aiohttp_server()
        self.relayed = handler
        if length is None or "upgrade" in head.headers:
            # A chunked body (or a protocol switch) aiohttp frames itself: the
            # connection is its own from here on (its keep-alive timeout is
            # head_timeout: daemon.py).
            self.mode = Mode.HANDED
            handler.connection_made(self.transport)
            data, self.pending = bytes(self.pending), bytearray()
            handler.data_received(head.raw + data)
            return
        if self.write_paused:
            self.relay_paused = True
            handler.pause_writing()
        take = min(length, len(self.pending))
        first = for_one_request(head) + bytes(self.pending[:take])
        del self.pending[:take]
        self.relay_left = length - take
        self.mode = Mode.RELAY_BODY if self.relay_left else Mode.RELAY_WAIT
        keep_alive = head.keep_alive and not self.front.closing
        handler.connection_made(RelayTransport(self.transport, self._relay_done, keep_alive=keep_alive,
                                               bodiless=head.method == "HEAD"))
        handler.data_received(first)

    def _relay_done(self, reusable: bool) -> None:
        # Called from inside aiohttp's own close; it finishes before we go on.
        asyncio.get_running_loop().call_soon(self._after_relay, self.relayed, reusable)

    def _after_relay(self, handler: RequestHandler | None, reusable: bool) -> None:
        if handler is not None and handler is self.relayed:
            self.relayed, self.relay_paused = None, False
            handler.connection_lost(None)
        if self.mode == Mode.CLOSED:
            return
        unread, self.relay_left = self.relay_left, 0
        if not reusable or self.front.closing or self.peer_eof or unread > self.front.max_request_size:
            self._close()
            return
        self._between_requests(unread)

    def _linger(self, unread: int) -> None:
        """Drop the refused body for a while before closing: a client still
        sending it would get a reset, not the answer, if we closed at once."""
        if not self._drop_body(unread):
            self._close()
            return
        self.mode, self.close_after_discard = Mode.DISCARD, True
        self._resume_reading()
        asyncio.get_running_loop().call_later(LINGER, self._close_if_open)

    def _close_if_open(self) -> None:
        if self.mode != Mode.CLOSED:
            self._close()

    def _between_requests(self, unread: int) -> None:
        """After an answer: drop what is left of its body, go on to the next."""
        self.last_active = time.monotonic()   # idle from here, however long the answer took
        self.mode = Mode.DISCARD if self._drop_body(unread) else Mode.HEAD
        self._resume_reading()
        if self.mode == Mode.HEAD:
            self._next_request()

    def _drop_body(self, unread: int) -> int:
        """Drop an answered request's unread body from ``pending``; what is
        still to come is dropped as it arrives (Mode.DISCARD). Returns that."""
        take = min(unread, len(self.pending))
        del self.pending[:take]
        self.discard_left = unread - take
        return self.discard_left

    def _refuse(self, status: int, message: str) -> None:
        """An answer to a head that cannot be read; the connection ends."""
        record_request(self.front.metrics, self.front.access_log, "unmatched", "?", "?", status, message, False,
                       time.perf_counter())
        answer = error_answer(status, message)
        self.transport.write(response_head(status, with_length(answer), close=True) + answer.payload)
        self._close()

    def _resume_reading(self) -> None:
        if not self.transport.is_closing() and not self.transport.is_reading():
            self.transport.resume_reading()

    def _big_buffers(self) -> None:
        if not self._big_send_buffer:
            self._big_send_buffer = True
            widen_send_buffer(self.transport)
