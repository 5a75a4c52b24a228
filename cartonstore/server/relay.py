"""One request of a front connection, answered by aiohttp.

The front (front.py) answers inference itself and gives every other
request to the daemon's aiohttp application, one request at a time: it
feeds a fresh aiohttp RequestHandler the request (its head rewritten to
"Connection: close") through a RelayTransport. aiohttp's answer goes
straight to the client's socket; its closing the relay is how the front
learns that the answer is complete, and the client's connection stays open
for the next request (the "Connection: close" aiohttp wrote is taken out of
the answer's head again).

Everything the relay does not override (sendfile's private hooks, the
socket, the write buffer) is the client transport's own, so FileResponse
still sends blobs with sendfile(2).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from .http1 import response_status, without_connection_close

_INTERIM = range(100, 200)


class RelayTransport(asyncio.Transport):
    """The client's transport, as one aiohttp handler sees it."""

    def __init__(self, client: asyncio.Transport, on_done: Callable[[bool], None], *, keep_alive: bool) -> None:
        super().__init__()
        self._client = client
        self._on_done = on_done
        self._keep_alive = keep_alive   # the client asked for a persistent connection
        self._head = bytearray()        # the answer's head, until it is whole
        self._head_done = False
        self._closed = False
        self.reusable = False           # the answer is complete and framed: the connection may go on

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this class lacks: sendfile's _sendfile_compatible,
        # _sock, _make_empty_waiter and the like belong to the client transport.
        return getattr(self._client, name)

    # -- writing: the answer's head is inspected, then everything passes through

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            return
        if self._head_done:
            self._client.write(data)
            return
        self._head += data
        while not self._head_done:
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, rest = bytes(self._head[:end + 4]), self._head[end + 4:]
            if response_status(head) in _INTERIM:   # 100 Continue: passed on, the real answer follows
                self._client.write(head)
                self._head = bytearray(rest)
                continue
            self._head_done = True
            self._head = bytearray()
            self.reusable = self._keep_alive and _framed(head)
            self._client.write(without_connection_close(head) if self.reusable else head)
            if rest:
                self._client.write(bytes(rest))

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
        self.reusable = self.reusable and self._head_done
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


def _framed(head: bytes) -> bool:
    """Whether the answer's length is known without a close: a
    Content-Length, chunked, or a status that has no body."""
    status = response_status(head)
    if status in (204, 304):
        return True
    lower = head.lower()
    return b"\r\ncontent-length:" in lower or b"\r\ntransfer-encoding: chunked" in lower
