"""The daemon's listening sockets: HTTP/1.1 connections whose inference
requests are answered here, and every other request by aiohttp.

Why inference does not go through aiohttp: its request and response
machinery costs ~0.25 ms of CPU per request on a 2-core VM, as much as the
whole proxy overhead the daemon may add (tests/bench/bench_infer.py). Here
an infer request is a parsed head, a body received in place into one
buffer, the shared validation and forwarding of infer_api.proxied_infer,
and one write of the answer.

Any other request (and an infer request with a chunked body) is handed to
aiohttp one request at a time through a RelayTransport (relay.py), so
tritonclient's connection can load, poll readiness and infer on one
keep-alive connection, with every request taking its own path.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from typing import TYPE_CHECKING

from aiohttp import web

from .app import SERVICE, failure, record_request
from .bodies import content_coding, decoded_body, too_large
from .http1 import MAX_HEAD, BadHead, RequestHead, for_one_request, parse_request_head, response_head
from .infer_api import CLIENT_SEND_BUFFER, STREAM_ANSWER, InferAnswer, proxied_infer, serving_model
from .relay import RelayTransport

if TYPE_CHECKING:
    from aiohttp.web_protocol import RequestHandler

RECV_CHUNK = 256 * 1024
MAX_PENDING = 256 * 1024   # pipelined bytes held while a request is answered; reading pauses past it
_INFER = re.compile(r"^/v2/models/([^/%?]+)(?:/versions/([^/%?]+))?/infer$")
_DROPPED = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"})

# What a connection is doing; each mode says where received bytes go.
HEAD, BODY, BUSY, RELAY_BODY, RELAY_WAIT, DISCARD, HANDED, CLOSED = range(8)


class ClientGone(Exception):
    """The client closed its connection before its request was whole."""


class FrontServer:
    """The daemon's connections, on any number of listening sockets."""

    def __init__(self, app: web.Application, aiohttp_server: web.Server, *, max_request_size: int,
                 keepalive_timeout: float = 75.0) -> None:
        self.app = app
        self.service = app[SERVICE]
        self.aiohttp_server = aiohttp_server
        self.max_request_size = max_request_size
        self.keepalive_timeout = keepalive_timeout
        self.connections: set[FrontConnection] = set()
        self.closing = False
        self._listeners: list[asyncio.AbstractServer] = []
        self._sweeper: asyncio.Task[None] | None = None

    async def listen(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        if sock.family == socket.AF_UNIX:
            server = await loop.create_unix_server(lambda: FrontConnection(self), sock=sock)
        else:
            server = await loop.create_server(lambda: FrontConnection(self), sock=sock)
        self._listeners.append(server)
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep())

    async def close(self, timeout: float) -> None:
        """Stop accepting; let requests in flight be answered (up to
        ``timeout``), closing each connection after its answer; then close
        whatever is left."""
        self.closing = True
        for server in self._listeners:
            server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        deadline = time.monotonic() + timeout
        while True:
            # A handed-over connection is aiohttp's: its own shutdown (AppRunner.cleanup) ends it.
            ours = [conn for conn in self.connections if conn.mode != HANDED]
            for conn in ours:
                if conn.idle():
                    conn.transport.close()
            if not ours or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.mode != HANDED:
                conn.transport.abort()

    async def _sweep(self) -> None:
        """Close connections silent for keepalive_timeout between requests
        or in the middle of sending one (a client that stalls)."""
        while True:
            await asyncio.sleep(min(10.0, self.keepalive_timeout / 2))
            limit = time.monotonic() - self.keepalive_timeout
            for conn in list(self.connections):
                if conn.mode in (HEAD, BODY, DISCARD) and conn.last_active < limit:
                    conn.transport.close()


class FrontConnection(asyncio.BufferedProtocol):
    """One client connection: requests one at a time, in order."""

    def __init__(self, front: FrontServer) -> None:
        self.front = front
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.mode = HEAD
        self.pending = bytearray()          # received, not yet consumed: heads, pipelined requests
        self.scratch = memoryview(bytearray(RECV_CHUNK))
        self.body: memoryview | None = None  # the unfilled rest of an infer body, received in place
        self.body_got = 0
        self.body_waiter: asyncio.Future[None] | None = None
        self.relayed: RequestHandler | None = None
        self.relay_left = 0                 # body bytes aiohttp has yet to be fed
        self.discard_left = 0               # body bytes of an answered request, dropped as they come
        self.drained: asyncio.Future[None] | None = None
        self.peer_eof = False
        self.last_active = time.monotonic()
        self._big_send_buffer = False

    # -- protocol callbacks -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.front.connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.body[self.body_got:] if self.mode == BODY else self.scratch  # type: ignore[index]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        if self.mode == BODY:
            self.body_got += nbytes
            if self.body_got == len(self.body):  # type: ignore[arg-type]
                self.body, self.mode = None, BUSY
                _wake(self.body_waiter)
            return
        data = self.scratch[:nbytes]
        if self.mode == HANDED:
            self.relayed.data_received(bytes(data))  # type: ignore[union-attr]
            return
        if self.mode == RELAY_BODY:
            take = min(nbytes, self.relay_left)
            self.relay_left -= take
            if self.relay_left == 0:
                self.mode = RELAY_WAIT
            self.relayed.data_received(bytes(data[:take]))  # type: ignore[union-attr]
            data = data[take:]
        elif self.mode == DISCARD:
            take = min(nbytes, self.discard_left)
            self.discard_left -= take
            if self.discard_left == 0:
                self.mode = HEAD
            data = data[take:]
        if len(data):
            self.pending += data
        if self.mode == HEAD:
            self._next_request()
        elif len(self.pending) > MAX_PENDING and self.mode != CLOSED:
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.peer_eof = True
        if self.mode == BODY:
            _fail(self.body_waiter, ClientGone())
        # Half-closed while its request is answered: keep the connection for the answer.
        return self.mode in (BUSY, RELAY_WAIT)

    def connection_lost(self, exc: Exception | None) -> None:
        self.mode = CLOSED
        self.front.connections.discard(self)
        _fail(self.body_waiter, ClientGone())
        _wake(self.drained)
        if self.relayed is not None:
            handler, self.relayed = self.relayed, None
            handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.relayed is not None:
            self.relayed.pause_writing()
        elif self.drained is None:
            self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.relayed is not None:
            self.relayed.resume_writing()
        _wake(self.drained)
        self.drained = None

    def idle(self) -> bool:
        """Between requests, with nothing of the next one received."""
        return self.mode == HEAD and not self.pending

    # -- requests ---------------------------------------------------------------

    def _next_request(self) -> None:
        """Start on the next whole request head in ``pending``, if any."""
        while self.pending[:2] == b"\r\n":   # empty lines between requests are allowed
            del self.pending[:2]
        end = self.pending.find(b"\r\n\r\n")
        if end < 0:
            if len(self.pending) > MAX_HEAD:
                self._refuse(431, f"request head longer than {MAX_HEAD} bytes")
            return
        raw = bytes(self.pending[:end + 4])
        del self.pending[:end + 4]
        try:
            head = parse_request_head(raw)
            length = head.content_length()
        except BadHead as e:
            self._refuse(e.status, str(e))
            return
        route = _INFER.match(head.path) if head.method == "POST" and length is not None else None
        if route is None or "upgrade" in head.headers:
            self._relay(head, length)
            return
        self.mode = BUSY
        asyncio.get_running_loop().create_task(self._infer(head, length, route[1], route[2]))

    async def _infer(self, head: RequestHead, length: int, name: str, version: str | None) -> None:
        started = time.perf_counter()
        unread = length
        try:
            service = self.front.service
            model = serving_model(service, name, version)  # an unknown model is refused before its body is read
            coding = content_coding(head.headers.get("content-encoding"))
            if length > self.front.max_request_size:
                raise too_large(length, self.front.max_request_size)
            if head.headers.get("expect", "").lower() == "100-continue":
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            raw = await self._read_body(length)
            unread = 0
            body = await decoded_body(raw, coding, self.front.max_request_size)
            answer = await proxied_infer(service, model, name, version, body,
                                         head.headers.get("inference-header-content-length"),
                                         head.headers.get("accept-encoding", ""))
        except ClientGone:
            return   # nothing reached the runner, and no one is left to answer
        except Exception as e:  # noqa: BLE001 - failure() logs what was not expected
            status, message, extra = failure(e, head.method, head.path)
            answer = InferAnswer(status, {"Content-Type": "application/json; charset=utf-8", **extra},
                                 json.dumps({"error": message}).encode(), message)
        route = "/v2/models/{name}/infer" if version is None else "/v2/models/{name}/versions/{version}/infer"
        record_request(self.front.app, route, head.method, head.target, answer.status, answer.error_text,
                       False, started)
        await self._answer(head, answer, unread)

    async def _read_body(self, length: int) -> bytearray:
        """The body, in one buffer: what is pending, the rest received in place."""
        out = bytearray(length)
        have = min(length, len(self.pending))
        out[:have] = self.pending[:have]
        del self.pending[:have]
        if have == length:
            return out
        self.body, self.body_got, self.mode = memoryview(out)[have:], 0, BODY
        self.body_waiter = asyncio.get_running_loop().create_future()
        self._resume_reading()
        try:
            await self.body_waiter
        finally:
            self.body_waiter = None
            self.body = None
        return out

    async def _answer(self, head: RequestHead, answer: InferAnswer, unread: int) -> None:
        if self.mode == CLOSED:
            return
        close = (not head.keep_alive or self.front.closing or self.peer_eof
                 or unread > self.front.max_request_size)
        headers = [(k, v) for k, v in answer.headers.items() if k.lower() not in _DROPPED]
        headers.append(("Content-Length", str(len(answer.payload))))
        out = response_head(answer.status, headers, close=close)
        if len(answer.payload) < STREAM_ANSWER:
            self.transport.write(out + answer.payload)
        else:
            self._big_buffers()
            self.transport.write(out)
            self.transport.write(memoryview(answer.payload))
        if close:
            self.transport.close()
            self.mode = CLOSED
            return
        if self.drained is not None:   # the client reads slower than it asks
            await self.drained
            if self.mode == CLOSED:
                return
        self._between_requests(unread)

    def _between_requests(self, unread: int) -> None:
        """After an answer: drop what is left of its body, go on to the next."""
        take = min(unread, len(self.pending))
        del self.pending[:take]
        self.discard_left = unread - take
        self.mode = DISCARD if self.discard_left else HEAD
        self._resume_reading()
        if self.mode == HEAD:
            self._next_request()

    def _refuse(self, status: int, message: str) -> None:
        """An answer to a head that cannot be read; the connection ends."""
        record_request(self.front.app, "unmatched", "?", "?", status, message, False, time.perf_counter())
        body = json.dumps({"error": message}).encode()
        self.transport.write(response_head(status, {"Content-Type": "application/json; charset=utf-8",
                                                    "Content-Length": str(len(body))}, close=True) + body)
        self.transport.close()
        self.mode = CLOSED

    # -- aiohttp's requests ------------------------------------------------------------

    def _relay(self, head: RequestHead, length: int | None) -> None:
        handler = self.front.aiohttp_server()
        self.relayed = handler
        if length is None or "upgrade" in head.headers:
            # A chunked body (or a protocol switch) aiohttp frames itself: the
            # connection is its own from here on.
            self.mode = HANDED
            handler.connection_made(self.transport)
            data, self.pending = bytes(self.pending), bytearray()
            handler.data_received(head.raw + data)
            return
        take = min(length, len(self.pending))
        first = for_one_request(head) + bytes(self.pending[:take])
        del self.pending[:take]
        self.relay_left = length - take
        self.mode = RELAY_BODY if self.relay_left else RELAY_WAIT
        keep_alive = head.keep_alive and not self.front.closing
        handler.connection_made(RelayTransport(self.transport, self._relay_done, keep_alive=keep_alive))
        handler.data_received(first)

    def _relay_done(self, reusable: bool) -> None:
        # Called from inside aiohttp's own close; it finishes before we go on.
        asyncio.get_running_loop().call_soon(self._after_relay, self.relayed, reusable)

    def _after_relay(self, handler: RequestHandler | None, reusable: bool) -> None:
        if handler is not None and handler is self.relayed:
            self.relayed = None
            handler.connection_lost(None)
        if self.mode == CLOSED:
            return
        unread, self.relay_left = self.relay_left, 0
        if not reusable or self.front.closing or self.peer_eof or unread > self.front.max_request_size:
            self.transport.close()
            self.mode = CLOSED
            return
        self._between_requests(unread)

    def _resume_reading(self) -> None:
        if not self.transport.is_closing() and not self.transport.is_reading():
            self.transport.resume_reading()

    def _big_buffers(self) -> None:
        """A big answer leaves a Unix socket in one send, not copied into
        asyncio's buffer (TCP tunes its own buffers)."""
        if self._big_send_buffer:
            return
        self._big_send_buffer = True
        sock = self.transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CLIENT_SEND_BUFFER)


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def _fail(waiter: asyncio.Future[None] | None, exc: BaseException) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_exception(exc)

