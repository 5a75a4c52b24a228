"""A big plain-HTTP body read from its socket by the stream's own thread.

Through aiohttp, every body byte is received on the event loop: 256 KiB
reads, each copied once more by the HTTP parser into a bytes object and
again when they are joined into the chunks handed to the stream's thread.
One loop thread receives for every stream, so eight downloads were received
on one core, and those two copies cost as much CPU as the zstd decoding (a
perf profile of bench_fetch phase 2: memmove 9% of the add's CPU, on the
loop thread).

A body with a Content-Length over plain TCP needs none of that. Once aiohttp
has read the status line and headers, take_socket() takes what it already
buffered of the body, stops its transport from reading, and hands the
stream's thread a duplicate of the socket: the thread waits on it (poll,
with SO_RCVLOWAT so each wake-up finds at least 256 KiB) and reads it
straight into the decoder, the hash and the file. The loop only waits for
the thread. aiohttp never sees the rest of the body, so the connection is
closed afterwards, not reused: for bodies of DIRECT_MIN or more, one new
connection is nothing.

Not taken: TLS (the bytes on the socket are still encrypted), chunked or
length-less bodies, small bodies, and transports that do not expose their
socket. Those go through aiohttp and StreamSink as before (sink.py).

What this takes from under aiohttp's client is pinned, test by test, in
tests/fetch/test_socket_body_contract.py.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cartonstore.errors import FetchError

from .client import translate
from .policy import describe
from .sink import in_own_thread

DIRECT_MIN = 4 << 20
"""Smaller bodies keep aiohttp's path and their kept-alive connection."""
READ_SIZE = 1 << 20
"""Bytes asked for per read: as aiohttp's path hands the stream's thread."""
LOW_WATER = 256 << 10
"""SO_RCVLOWAT: poll wakes once this much has arrived (or the body ends), not
for every segment; without it a fast stream is read 16-64 KiB at a time."""
POLL_SLICE_MS = 250
"""A quiet socket is still read this often, so a body slower than LOW_WATER
per stall_timeout is not taken for a stalled one (aiohttp's sock_read counts
any byte as progress)."""


@dataclass
class TakenSocket:
    """A body's socket, taken from aiohttp: what it had buffered (``head``)
    and a duplicate of the socket (``fd``) for the rest."""

    head: list[bytes]
    fd: int
    stop_r: int = field(default=-1)
    stop_w: int = field(default=-1)

    def close(self) -> None:
        for fd in (self.fd, self.stop_r, self.stop_w):
            if fd >= 0:
                os.close(fd)
        self.fd = self.stop_r = self.stop_w = -1


def _socket_fd(raw: object, length: int | None, headers: object) -> int | None:
    """The socket under a plain-TCP aiohttp response whose body can be read
    directly, or None."""
    if length is None or length < DIRECT_MIN or "Transfer-Encoding" in headers:  # type: ignore[operator]  # aiohttp's headers: a mapping
        return None
    connection = getattr(raw, "connection", None)
    transport = getattr(connection, "transport", None)
    protocol = getattr(connection, "protocol", None)
    if transport is None or protocol is None or transport.is_closing():
        return None
    if transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    fd = sock.fileno() if sock is not None else -1
    if fd < 0 or getattr(sock, "type", None) != socket.SOCK_STREAM:
        return None
    return fd


def take_socket(raw: object, length: int | None, headers: object) -> TakenSocket | None:
    """Take the rest of a response's body from aiohttp, or None where it
    must stay aiohttp's. Synchronous on purpose: between draining aiohttp's
    buffer and pausing its transport the loop must not run, or a read could
    land in the buffer after it was drained. aiohttp's own errors (a body
    already broken) are raised as they are."""
    fd = _socket_fd(raw, length, headers)
    if fd is None:
        return None
    content = raw.content  # type: ignore[attr-defined]  # aiohttp's ClientResponse, typed object to keep aiohttp unimported
    protocol = raw.connection.protocol  # type: ignore[attr-defined]  # aiohttp's ClientResponse, typed object to keep aiohttp unimported
    head = []
    # Draining may resume a parser that flow control paused, which feeds
    # more into the buffer: read until it stays empty.
    while chunk := content.read_nowait():
        head.append(chunk)
    if content.is_eof():  # all of it was buffered: aiohttp may have reused the connection already
        return TakenSocket(head, -1)
    protocol.pause_reading()  # also stops its read timeout
    taken = TakenSocket(head, -1)
    try:
        taken.stop_r, taken.stop_w = os.pipe()
        taken.fd = os.dup(fd)  # ours: aiohttp closing its socket does not free the number under the thread
    except OSError:
        taken.close()
        raise
    return taken


def receive(taken: TakenSocket, want: int, work: Callable[[bytes], None], *, url: str,
            stall_timeout: float | None, counted: Callable[[int], None] | None = None) -> int:
    """In the stream's thread: hand ``work`` the buffered head, then read the
    socket until ``want`` bytes in all were handed over. Returns the bytes
    handed over; fewer only if told to stop (a byte on taken.stop_w). A
    body that ends early, a reset or a stall raise FetchError (retryable),
    as aiohttp's would; bytes handed over before stay handed over, so a
    resume starts after them."""
    got = 0

    def hand(chunk: bytes) -> None:
        nonlocal got
        work(chunk)
        got += len(chunk)
        if counted is not None:
            counted(len(chunk))

    for chunk in taken.head:
        if chunk[: want - got]:
            hand(chunk[: want - got])
    if got < want and taken.fd < 0:  # the body ended within what aiohttp had buffered
        raise _ended_early(url, got, want)
    if got >= want:
        return got
    sock = socket.socket(fileno=taken.fd)  # taken.fd stays taken's: detached, not closed, below
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, LOW_WATER)   # lowered for the last bytes
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        poller.register(taken.stop_r, select.POLLIN)
        while got < want:
            try:
                chunk = _next_chunk(sock, poller, taken.stop_r, want - got, stall_timeout)  # type: ignore[assignment]  # None: below
            except OSError as e:   # a reset; TimeoutError: a stall. Named as aiohttp's are
                raise translate(e, url) from e
            if chunk is None:
                return got
            if not chunk:
                raise _ended_early(url, got, want)
            hand(chunk)
        return got
    finally:
        sock.detach()


def _next_chunk(sock: socket.socket, poller: select.poll, stop_r: int, wanted: int,
                stall_timeout: float | None) -> bytes | None:
    """The body's next bytes (b"" at the connection's end), or None once told
    to stop. Raises TimeoutError after stall_timeout with no byte, OSError
    for the socket's own errors."""
    if wanted < LOW_WATER:   # the last bytes: a mark above them would leave them unread until the slice ends
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, wanted)
    quiet_since = time.monotonic()
    while True:
        if any(fd == stop_r for fd, _ in poller.poll(POLL_SLICE_MS)):
            return None
        try:
            # Also after a quiet slice: a slow body's bytes wait below the low-water mark.
            # MSG_DONTWAIT: the fd is the event loop's, non-blocking today; a
            # blocking recv here could wake neither for the stall nor the stop.
            return sock.recv(min(READ_SIZE, wanted), socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            if stall_timeout is not None and time.monotonic() - quiet_since > stall_timeout:
                raise TimeoutError("no bytes received within the stall timeout") from None


def _ended_early(url: str, got: int, want: int) -> FetchError:
    return FetchError(f"{describe(url)}: body ended early or was malformed (the connection closed after {got} "
                      f"of {want} bytes)", subject=url, retryable=True)


async def receive_directly(taken: TakenSocket, raw: object, want: int, work: Callable[[bytes], None], *,
                           url: str, stall_timeout: float | None,
                           counted: Callable[[int], None] | None = None) -> int:
    """receive() in a thread of its own, while the loop waits. Cancelled,
    it stops the thread and waits for the chunk in hand (so nothing writes
    into a file its caller is about to reuse). The connection is closed in
    the end: aiohttp did not see the body."""
    thread: asyncio.Future | None = None
    try:
        thread = in_own_thread(lambda: receive(taken, want, work, url=url, stall_timeout=stall_timeout,
                                               counted=counted), name="fetch")
        return await asyncio.shield(thread)
    finally:
        while thread is not None and not thread.done():  # cancelled: the thread is told, and waited for
            if taken.stop_w >= 0:
                os.write(taken.stop_w, b"x")
            try:
                await asyncio.wait([thread])
            except asyncio.CancelledError:
                continue
        if thread is not None and not thread.cancelled():
            thread.exception()  # retrieved: what it raised is raised above, or moot after a cancel
        taken.close()
        raw.close()  # type: ignore[attr-defined]  # aiohttp's ClientResponse, typed object to keep aiohttp unimported
