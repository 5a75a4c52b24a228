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
into one bytearray of its final size.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from typing import Mapping, Sequence
from urllib.parse import quote

from cartonstore.errors import InvalidInput
from cartonstore.v2.http1 import chunk_size

MAX_HEAD = 1 << 20        # status line + headers of one response
IDLE_LIMIT = 30.0         # below the runner SDK's 75 s keep-alive (and aiohttp's), so a runner never closes one we pick
SOCKET_BUFFER = 4 << 20   # a 4 MiB tensor goes out in one send (the kernel caps it at wmem_max)
RECV_CHUNK = 1 << 16      # heads and chunked bodies are received this much at a time; smaller writes are joined
_NO_BODY = (204, 304)


class BadResponse(Exception):
    """The runner broke HTTP: not a response, a truncated one, or a closed connection."""


class _Eof(Exception):
    """The peer closed the connection; ``partial`` says whether mid-answer."""

    def __init__(self, partial: bool) -> None:
        super().__init__()
        self.partial = partial


@functools.lru_cache(maxsize=1024)
def _request_line(method: str, path: str) -> bytes:
    target = quote(path, safe="/:@!$&'()*+,;=-._~%?")
    if not target.startswith("/"):
        raise InvalidInput(f"runner request path {path!r} must start with '/'")
    return f"{method} {target} HTTP/1.1\r\nHost: runner\r\n".encode("ascii")


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


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
        sock = conn.transport.get_extra_info("socket")
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        return conn

    # -- protocol callbacks ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.target[self.target_got:] if self.target is not None else self.scratch

    def buffer_updated(self, nbytes: int) -> None:
        self.got_any = True
        if self.target is not None:
            self.target_got += nbytes
            if self.target_got == len(self.target):
                self.target = None
                _wake(self.waiter)
            return
        self.pending += self.scratch[:nbytes]
        _wake(self.waiter)

    def eof_received(self) -> bool:
        self.eof = True
        _wake(self.waiter)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.lost = exc or ConnectionAbortedError("connection closed")
        # target stays: readexactly's next _more() sees eof and fails the cut-short answer
        _wake(self.waiter)
        _wake(self.drained)

    def pause_writing(self) -> None:
        self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        _wake(self.drained)
        self.drained = None

    # -- for the client ---------------------------------------------------------

    def usable(self, now: float) -> bool:
        return (not self.eof and self.transport is not None and not self.transport.is_closing()
                and self.start == len(self.pending) and now - self.idle_since < IDLE_LIMIT)

    async def send(self, parts: list[bytes | memoryview]) -> None:
        """Small requests in one write; big parts each on their own (the
        socket's big send buffer takes them whole, so the transport keeps no
        copy), never joined."""
        if self.lost is not None or self.transport is None:
            raise ConnectionResetError("connection lost")
        if sum(len(p) for p in parts) < RECV_CHUNK:
            self.transport.write(b"".join(parts))
        else:
            for part in parts:
                if len(part):
                    self.transport.write(part)
        if self.drained is not None:
            await self.drained
            if self.lost is not None:
                raise ConnectionResetError("connection lost while sending")

    async def _more(self) -> None:
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
                data = bytes(self.pending[self.start:end])
                self.start = end
                if self.start == len(self.pending):
                    self.pending.clear()
                    self.start = 0
                return data
            if len(self.pending) - self.start > limit:
                raise BadResponse(f"response head longer than {limit} bytes")
            await self._more()

    async def readexactly(self, size: int) -> bytearray:
        """``size`` bytes in one bytearray: what is pending, then the rest
        received straight into it."""
        try:
            out = bytearray(size)
        except (MemoryError, OverflowError):   # a length no one can hold (2**63 overflows): the runner's lie
            raise BadResponse(f"an answer body of {size} bytes does not fit in the daemon's memory") from None
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
                    await self._more()
            finally:
                self.target = None
        return out

    async def read_to_eof(self) -> bytes:
        while not self.eof:
            await self._more()
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
                      body: Sequence[bytes | bytearray | memoryview] = ()) -> tuple[int, dict[str, str], bytes | bytearray]:
        """(status, headers with lower-case names, body). Raises OSError when
        the socket cannot be reached, BadResponse when the answer is not HTTP.
        A Content-Length body comes back as a bytearray (received in place)."""
        if self.closed:
            raise BadResponse("client is closed")
        # Wide-item views (e.g. of a float32 array) go out as their bytes.
        body = [p if isinstance(p, (bytes, bytearray)) else memoryview(p).cast("B") for p in body]
        size = sum(len(p) for p in body)
        head = [_request_line(method, path), b"Content-Length: %d\r\n" % size]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
                raise InvalidInput(f"header {name!r} cannot be sent to a runner: it holds a line break or colon")
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head.append(b"\r\n")
        conn = await self._acquire()
        self._busy.add(conn)
        reusable = False
        try:
            conn.got_any = False
            await conn.send([b"".join(head), *body])
            status, response_headers, answer, reusable = await _read_response(conn)
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


async def _read_response(conn: _Connection) -> tuple[int, dict[str, str], bytes | bytearray, bool]:
    """One response: (status, headers, body, whether the connection may be reused)."""
    try:
        while True:
            head = await conn.readuntil(b"\r\n\r\n", MAX_HEAD)
            status, version, headers = _parse_head(head)
            if status >= 200 or status == 101:
                break   # 1xx interim answers carry nothing for us
        connection = headers.get("connection", "").lower()
        keep = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        if status in _NO_BODY:
            return status, headers, b"", keep
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return status, headers, await _read_chunked(conn), keep
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise BadResponse(f"bad Content-Length {length!r}")
            return status, headers, await conn.readexactly(int(length)), keep
        return status, headers, await conn.read_to_eof(), False   # framed by the end of the connection
    except _Eof as e:
        what = "closed the connection mid-answer" if e.partial else "closed the connection without answering"
        raise BadResponse(what) from None
    except (ConnectionResetError, BrokenPipeError, ValueError) as e:
        raise BadResponse(f"{type(e).__name__}: {e}") from None


def _parse_head(head: bytes) -> tuple[int, str, dict[str, str]]:
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0") or not (len(parts[1]) == 3 and parts[1].isdigit()):
        raise BadResponse(f"not an HTTP response: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadResponse(f"bad response header line {line[:80]!r}")
        headers[name.lower()] = value.strip()
    return int(parts[1]), parts[0], headers


async def _read_chunked(conn: _Connection) -> bytes:
    chunks = []
    while True:
        try:
            size = chunk_size(await conn.readuntil(b"\r\n", MAX_HEAD))
        except ValueError as exc:
            raise BadResponse(str(exc)) from None
        if size == 0:
            while await conn.readuntil(b"\r\n", MAX_HEAD) != b"\r\n":
                pass   # trailers: none that matter to us
            return b"".join(chunks)
        chunks.append(await conn.readexactly(size))
        if await conn.readexactly(2) != b"\r\n":
            raise BadResponse("chunk not followed by CRLF")
