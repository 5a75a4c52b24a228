"""One request of a front connection, answered by aiohttp.

The front (connection.py) answers inference itself and gives every other
request to the daemon's aiohttp application, one request at a time: it
feeds a fresh aiohttp RequestHandler the request (its head rewritten to
"Connection: close") through a RelayTransport. aiohttp's answer goes
straight to the client's socket; its closing the relay is how the front
learns that the answer is complete, and the client's connection stays open
for the next request (the "Connection: close" aiohttp wrote is taken out of
the answer's head again). FrontConnection._relay is the connection's side
of it; tests/server/test_relay_contract.py pins what this relies on of
aiohttp's server.

The connection is kept only when the answer is provably whole: a
Content-Length body fully written, or a chunked body's last chunk. An
answer aiohttp abandons half-way (an error after the head went out) ends
the connection, so no client reads one answer's bytes as another's.

No sendfile(2) through a relay: asyncio's native sendfile re-registers
the transport it is given in the loop's weak map of transports, and a
relay lives for one request, so a second blob on the connection would
fail. FileResponse then writes the file in chunks, as on uvloop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from cartonstore.v2.http1 import (
    BadChunks,
    ChunkedBody,
    ResponseHead,
    parse_response_head,
    without_connection_close,
)

_INTERIM = range(100, 200)


class RelayTransport(asyncio.Transport):
    """The client's transport, as one aiohttp handler sees it."""

    def __init__(self, client: asyncio.Transport, on_done: Callable[[bool], None], *, keep_alive: bool,
                 bodiless: bool = False) -> None:
        super().__init__()
        self._client = client
        self._on_done = on_done
        self._keep_alive = keep_alive   # the client asked for a persistent connection
        self._bodiless = bodiless       # a HEAD request: its answer's Content-Length has no body behind it
        self._head = bytearray()        # the answer's head, until it is whole
        self._head_done = False
        self._closed = False
        self.reusable = False           # the answer is complete and framed: the connection may go on
        self._body_left: int | None = None   # Content-Length bytes still to come
        self._chunks: ChunkedBody | None = None   # a chunked body's decoder, to see where it ends
        self._past_end = False          # bytes came after the answer's end, or it broke its framing

    @property
    def _sendfile_compatible(self) -> Any:
        # loop.sendfile() reads this first; aiohttp's FileResponse answers
        # NotImplementedError by writing the file through write().
        raise NotImplementedError("no sendfile through a relay")

    # -- writing: the answer's head is inspected, then everything passes through

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            return
        if self._head_done:
            self._count(data)
            self._client.write(data)
            return
        self._head += data
        while not self._head_done:
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, rest = bytes(self._head[:end + 4]), self._head[end + 4:]
            try:
                answer: ResponseHead | None = parse_response_head(head, keep_body=False)
            except ValueError:   # not from aiohttp's writer: passed on, and the connection ends after it
                answer = None
            if answer is not None and answer.status in _INTERIM:   # 100 Continue: the real answer follows
                self._client.write(head)
                self._head = bytearray(rest)
                continue
            self._head_done = True
            self._head = bytearray()
            self.reusable = self._keep_alive and answer is not None and self._framing(answer)
            self._client.write(without_connection_close(head) if self.reusable else head)
            if rest:
                self._count(rest)
                self._client.write(bytes(rest))

    def _framing(self, answer: ResponseHead) -> bool:
        """Learn how the answer's body ends; False when only a close ends it."""
        if answer.status in (204, 304) or self._bodiless:
            self._body_left = 0
            return True
        if answer.is_chunked:
            self._chunks = answer.chunked_body()
            return True
        value = answer.headers.get("content-length")
        if value is None:
            return False
        self._body_left = int(value)
        return True

    def _count(self, data: bytes | bytearray | memoryview) -> None:
        if self._body_left is not None:
            self._body_left -= len(data)
        elif self._chunks is not None and not self._past_end:
            data = data if isinstance(data, (bytes, bytearray)) else bytes(data)
            try:
                taken = self._chunks.feed(data)
            except BadChunks:   # not a chunked body after all: only a close can end it
                taken = -1
            self._past_end = taken is not None and taken != len(data)

    def _whole(self) -> bool:
        if self._body_left is not None:
            return self._body_left == 0
        return self._chunks is not None and self._chunks.ended and not self._past_end

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("a relayed answer ends by closing the relay")

    def get_write_buffer_size(self) -> int:
        return self._client.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._client.set_write_buffer_limits(high, low)

    # -- the end of the answer ------------------------------------------------------

    def is_closing(self) -> bool:
        return self._closed or self._client.is_closing()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.reusable = self.reusable and self._head_done and self._whole()
        self._on_done(self.reusable)

    def abort(self) -> None:
        self._closed = True
        self.reusable = False
        self._client.abort()
        self._on_done(False)

    # -- reading belongs to the front, which feeds the handler ------------------------

    def pause_reading(self) -> None:
        self._client.pause_reading()

    def resume_reading(self) -> None:
        if not self._closed:
            self._client.resume_reading()

    def is_reading(self) -> bool:
        return self._client.is_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._client.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        raise NotImplementedError("a relayed request cannot take over the connection")

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._client.get_protocol()
