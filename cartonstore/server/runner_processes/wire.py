"""A lean HTTP/1.1 client for one runner's Unix socket, with a pool of
keep-alive connections.

Why not aiohttp's client: on the request path it costs about 0.3 ms per
request by itself (measured against this client on the same runner), more
than the daemon's whole proxy budget. The runner side is always an HTTP/1.1
server we talk to over a private socket, so this client only needs: one
request at a time per connection, Content-Length request bodies, and
responses framed by Content-Length, chunked encoding or end of connection.

Why a BufferedProtocol and not asyncio streams: tensors are megabytes, and
streams copy them several times (writelines joins the parts, the transport
buffers what the kernel did not take, StreamReader buffers and readexactly
copies out). Here big parts are written one by one to a socket whose send
buffer takes them whole, and a Content-Length body is received straight
into one buffer of its final size.

A runner is model code, and hostile: it decides nothing about what the
daemon allocates. Every answer has a limit (``limit``: the model's answer
size for infer, CONTROL_ANSWER for health and the rest), a head has at
most MAX_HEAD bytes and MAX_HEADERS lines, and an answer over its limit is
refused when its head says so, or as soon as its bytes pass the limit
(chunked, or framed by the end of the connection). A claimed length is
never zero-filled at once: a big body's buffer is unfilled memory
(system/unfilled.py) that the kernel commits page by page as bytes arrive,
so a runner that claims 200 MiB and sends one byte costs one page.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections.abc import Mapping, Sequence
from urllib.parse import quote

from cartonstore.errors import InvalidInput
from cartonstore.format.units import format_size
from cartonstore.runner.protocol import DAEMON_IDLE_LIMIT
from cartonstore.system.unfilled import unfilled_bytearray
from cartonstore.system.waiters import wake
from cartonstore.v2.http1 import (
    BadChunks,
    ChunkedBody,
    parse_response_head,
)

MAX_HEAD = 64 << 10       # status line + headers of one response
MAX_INTERIM = 8           # 1xx answers before the real one
CONTROL_ANSWER = 64 << 10  # health, server metadata, shared-memory registration: small JSON or nothing
MIN_CHUNK = 1024          # a chunked answer's chunks, on average, at least: each costs the loop a few steps
MAX_CHUNKS = 65536
SOCKET_BUFFER = 4 << 20   # a 4 MiB tensor goes out in one send (the kernel caps it at wmem_max)
RECV_CHUNK = 1 << 16      # heads and chunked bodies are received this much at a time; smaller writes are joined
_NO_BODY = (204, 304)


class BadResponse(Exception):
    """The runner broke HTTP: not a response, a truncated one, one over its
    limit, or a closed connection. ``answered``: bytes of an answer came
    (the runner answered, wrongly), as against no answer at all."""

    def __init__(self, message: str, *, answered: bool = False) -> None:
        super().__init__(message)
        self.answered = answered


class Unsent(ConnectionError):
    """Not one byte of the request went out: the connection could not be
    opened, or was lost, or the client closed, before it was written. The
    server never saw the request; it may go elsewhere."""


class _Eof(Exception):
    """The peer closed the connection; ``partial`` says whether mid-answer."""

    def __init__(self, partial: bool) -> None:
        super().__init__()
        self.partial = partial


@functools.lru_cache(maxsize=1024)
def request_line(method: str, path: str) -> bytes:
    target = quote(path, safe="/:@!$&'()*+,;=-._~%?")
    if not target.startswith("/"):
        raise InvalidInput(f"runner request path {path!r} must start with '/'")
    return f"{method} {target} HTTP/1.1\r\nHost: runner\r\n".encode("ascii")


class _Connection(asyncio.BufferedProtocol):
    """One connection, as a protocol that receives in place: into
    ``pending`` (consumed from ``start``) for heads and chunked bodies, or
    straight into the caller's buffer while ``readexactly`` waits on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending = bytearray()
        self.start = 0
        self.scratch = memoryview(bytearray(RECV_CHUNK))
        self.target: memoryview | None = None   # readexactly's unfilled rest, while it waits
        self.target_got = 0
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.eof = False
        self.lost: BaseException | None = None
        self.idle_since = 0.0
        self.got_any = False   # any byte of the current answer: tells "no answer" from "cut short"

    @classmethod
    async def open(cls, address: str | tuple[str, int]) -> _Connection:
        """address: a Unix socket path, or (host, port) over TCP."""
        loop = asyncio.get_running_loop()
        if isinstance(address, str):
            _, conn = await loop.create_unix_connection(cls, address)
        else:
            _, conn = await loop.create_connection(cls, *address)
        sock = conn.transport.get_extra_info("socket")  # type: ignore[union-attr]  # connected: it has its transport
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        return conn

    # -- protocol callbacks ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream connection makes a stream transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.target[self.target_got:] if self.target is not None else self.scratch

    def buffer_updated(self, nbytes: int) -> None:
        self.got_any = True
        if self.target is not None:
            self.target_got += nbytes
            if self.target_got == len(self.target):
                self.target = None
                wake(self.waiter)
            return
        self.pending += self.scratch[:nbytes]
        wake(self.waiter)

    def eof_received(self) -> bool:
        self.eof = True
        wake(self.waiter)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.lost = exc or ConnectionAbortedError("connection closed")
        # target stays: readexactly's next more() sees eof and fails the cut-short answer
        wake(self.waiter)
        wake(self.drained)

    def pause_writing(self) -> None:
        self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        wake(self.drained)
        self.drained = None

    # -- for the client ---------------------------------------------------------

    def usable(self, now: float) -> bool:
        return (not self.eof and self.transport is not None and not self.transport.is_closing()
                and self.start == len(self.pending) and now - self.idle_since < DAEMON_IDLE_LIMIT)

    async def send(self, parts: list[bytes | bytearray | memoryview]) -> None:
        """Small requests in one write; big parts each on their own (the
        socket's big send buffer takes them whole, so the transport keeps no
        copy), never joined."""
        if self.lost is not None or self.transport is None:
            raise Unsent("connection lost")
        if sum(len(p) for p in parts) < RECV_CHUNK:
            self.transport.write(b"".join(parts))
            self._check_first_write()
        else:
            first = True
            for part in parts:
                if len(part):
                    self.transport.write(part)
                    if first:
                        self._check_first_write()
                        first = False
        if self.drained is not None:
            await self.drained
            if self.lost is not None:
                raise ConnectionResetError("connection lost while sending")

    def _check_first_write(self) -> None:
        """The transport sends a first write at once; a transport closing
        right after it failed that send (the peer is gone: EPIPE), so not a
        byte went out."""
        if self.transport is not None and self.transport.is_closing():
            raise Unsent("connection lost: the server is gone")

    async def more(self) -> None:
        """Wait until something arrives; _Eof when nothing more will."""
        if self.eof:
            raise _Eof(self.got_any)
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    async def readuntil(self, separator: bytes, limit: int) -> bytes:
        while True:
            end = self.pending.find(separator, self.start)
            if end >= 0:
                end += len(separator)
                if end - self.start > limit:
                    raise BadResponse(f"response head longer than {limit} bytes", answered=True)
                data = bytes(self.pending[self.start:end])
                self.start = end
                if self.start == len(self.pending):
                    self.pending.clear()
                    self.start = 0
                return data
            if len(self.pending) - self.start > limit:
                raise BadResponse(f"response head longer than {limit} bytes", answered=True)
            await self.more()

    async def readexactly(self, size: int) -> bytearray:
        """``size`` bytes in one bytearray: what is pending, then the rest
        received straight into it; unfilled until then (system/unfilled.py)."""
        try:
            out = unfilled_bytearray(size)
        except MemoryError:   # a claim within its limit that this host cannot hold
            raise BadResponse(f"answered a body of {size} bytes, which the daemon cannot hold", answered=True) from None
        have = min(size, len(self.pending) - self.start)
        out[:have] = memoryview(self.pending)[self.start:self.start + have]
        self.start += have
        if self.start == len(self.pending):
            self.pending.clear()
            self.start = 0
        if have < size:
            self.target, self.target_got = memoryview(out)[have:], 0
            try:
                while self.target is not None:
                    await self.more()
            finally:
                self.target = None
        return out

    async def read_to_eof(self, limit: int) -> bytes:
        while not self.eof:
            if len(self.pending) - self.start > limit:
                raise BadResponse(f"answered more than {format_size(limit)} (its limit) before closing the "
                                  f"connection", answered=True)
            await self.more()
        if len(self.pending) - self.start > limit:
            raise BadResponse(f"answered more than {format_size(limit)} (its limit)", answered=True)
        data = bytes(self.pending[self.start:])
        self.pending.clear()
        self.start = 0
        return data

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class RunnerClient:
    """Requests to the HTTP server at ``address`` (a Unix socket path; or
    (host, port), which benches use to reach other servers the same way).
    Connections are opened as needed and kept while the server keeps them
    alive; ``close`` aborts every one, which fails requests still waiting on them."""

    def __init__(self, address: str | tuple[str, int]) -> None:
        self.address = address
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        self.closed = False

    async def _acquire(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable(now):
                return conn
            conn.close()
        return await _Connection.open(self.address)

    async def request(self, method: str, path: str, headers: Mapping[str, str],
                      body: Sequence[bytes | bytearray | memoryview] = (), *,
                      limit: int = CONTROL_ANSWER) -> tuple[int, dict[str, str], bytes | bytearray]:
        """(status, headers with lower-case names, body). Raises OSError when
        the socket cannot be reached (Unsent), BadResponse when the answer is not HTTP
        or its body is over ``limit`` bytes (the connection is then closed).
        A Content-Length body comes back as one buffer, received in place."""
        if self.closed:
            raise Unsent("client is closed")
        # Wide-item views (e.g. of a float32 array) go out as their bytes.
        body = [p if isinstance(p, (bytes, bytearray)) else memoryview(p).cast("B") for p in body]
        size = sum(len(p) for p in body)
        head = [request_line(method, path), b"Content-Length: %d\r\n" % size]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
                raise InvalidInput(f"header {name!r} cannot be sent to a runner: it holds a line break or colon")
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head.append(b"\r\n")
        try:
            conn = await self._acquire()
        except OSError as e:
            raise Unsent(f"cannot connect: {e.strerror or e}") from e
        if self.closed:   # closed while connecting
            conn.close()
            raise Unsent("client is closed")
        self._busy.add(conn)
        reusable = False
        try:
            conn.got_any = False
            await conn.send([b"".join(head), *body])
            status, response_headers, answer, reusable = await _read_response(conn, limit)
            return status, response_headers, answer
        finally:
            self._busy.discard(conn)
            if reusable and not self.closed:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            else:
                conn.close()

    def close(self) -> None:
        self.closed = True
        for conn in (*self._idle, *self._busy):
            conn.close()
        self._idle.clear()


async def _read_response(conn: _Connection, limit: int) -> tuple[int, dict[str, str], bytes | bytearray, bool]:
    """One response: (status, headers, body, whether the connection may be reused)."""
    try:
        for _ in range(MAX_INTERIM + 1):
            head = parse_response_head(await conn.readuntil(b"\r\n\r\n", MAX_HEAD))
            if head.status >= 200 or head.status == 101:
                break   # 1xx interim answers carry nothing for us
        else:
            raise BadResponse(f"more than {MAX_INTERIM} interim (1xx) answers before its answer", answered=True)
        status, headers, keep = head.status, head.headers, head.keep_alive
        if status in _NO_BODY:
            return status, headers, b"", keep
        if head.is_chunked:
            most = max(16, min(limit // MIN_CHUNK, MAX_CHUNKS))
            return status, headers, await _read_chunked(conn, head.chunked_body(limit, most), limit), keep
        length = headers.get("content-length")
        if length is not None:
            if int(length) > limit:
                raise BadResponse(f"answered with Content-Length {length}, over its limit of "
                                  f"{format_size(limit)} ({limit} bytes)", answered=True)
            return status, headers, await conn.readexactly(int(length)), keep
        return status, headers, await conn.read_to_eof(limit), False   # framed by the end of the connection
    except _Eof as e:
        what = "closed the connection mid-answer" if e.partial else "closed the connection without answering"
        raise BadResponse(what, answered=e.partial) from None
    except ValueError as e:   # a head llhttp refused, its fault named (v2/http1_faults.py)
        raise BadResponse(str(e), answered=True) from None
    except (ConnectionResetError, BrokenPipeError) as e:
        raise BadResponse(f"{type(e).__name__}: {e}", answered=conn.got_any) from None


async def _read_chunked(conn: _Connection, decoder: ChunkedBody, limit: int) -> bytearray:
    """A chunked body, decoded as it comes. Chunks cost loop time each, so
    an answer has at most one per MIN_CHUNK bytes of its limit (and at most
    MAX_CHUNKS): the decoder's ``max_chunks``."""
    while True:
        try:
            taken = decoder.feed(conn.pending, conn.start)
        except BadChunks as e:
            raise BadResponse(_chunk_fault(e, decoder, limit), answered=True) from None
        if taken is None:
            conn.pending.clear()
            conn.start = 0
            await conn.more()
            continue
        conn.start += taken
        if conn.start == len(conn.pending):
            conn.pending.clear()
            conn.start = 0
        return decoder.body


def _chunk_fault(e: BadChunks, decoder: ChunkedBody, limit: int) -> str:
    if e.broken == "chunks":
        return (f"answered in more than {decoder.max_chunks} chunks (chunks of {MIN_CHUNK} bytes or more, on "
                f"average, are what its limit of {format_size(limit)} allows)")
    return f"answered {e}" if e.broken != "framing" else str(e)
