"""What the front's relay to aiohttp (cartonstore/server/http/relay.py and
FrontConnection._relay) relies on of aiohttp's server, pinned.

The relay feeds a fresh aiohttp RequestHandler (``web.Server()``) one
request through a RelayTransport and learns from aiohttp's own writes and
its close where the answer ends. None of that is aiohttp's documented API,
and aiohttp is pinned to one minor release for it (pyproject.toml): each
test here names the aiohttp behaviour it pins, and fails if that changes.

A real FrontServer listens on 127.0.0.1, in this process, on asyncio's
loop and on uvloop's (the daemon's), in front of a real aiohttp
application whose handlers answer in each of the ways aiohttp frames an
answer, or misbehave on purpose. Requests are written byte for byte
(test_front.Conn), so framing and connection reuse are what is read.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from test_front import Conn, get

from cartonstore.server.calls.access import TcpAccess
from cartonstore.server.calls.bodies import BodyBudget
from cartonstore.server.http.listeners import FrontServer
from cartonstore.server.models.metrics import Metrics

FILE = os.urandom((1 << 20) + 12_345)   # more than one of FileResponse's 256 KiB chunks
PARTS = [b"first part ", os.urandom(100_000), b" last part"]
BIG = 32 << 20                          # an answer far over every write buffer and socket buffer
PIECE = 256 << 10
BIG_WRITES = web.AppKey("big_writes", list)


def app_behind_the_front(file_path: Path) -> web.Application:
    """Handlers for each way an answer is framed, and for one abandoned."""
    app = web.Application()
    app[BIG_WRITES] = []

    async def plain(request: web.Request) -> web.Response:
        return web.Response(text="plain")

    async def file(request: web.Request) -> web.FileResponse:
        return web.FileResponse(file_path)

    async def chunked(request: web.Request) -> web.StreamResponse:
        answer = web.StreamResponse()
        answer.enable_chunked_encoding()
        await answer.prepare(request)
        for part in PARTS:
            await answer.write(part)
        await answer.write_eof()
        return answer

    async def abandoned(request: web.Request) -> web.StreamResponse:
        answer = web.StreamResponse()
        if request.match_info["framing"] == "chunked":
            answer.enable_chunked_encoding()
        else:
            answer.content_length = 1000
        await answer.prepare(request)
        await answer.write(b"x" * 10)
        raise RuntimeError("the handler fails after the head went out")

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    async def big(request: web.Request) -> web.StreamResponse:
        """BIG bytes, noting after each write how much the client's
        transport holds unsent."""
        answer = web.StreamResponse()
        answer.content_length = BIG
        await answer.prepare(request)
        piece, unsent = b"b" * PIECE, app[BIG_WRITES]
        for _ in range(BIG // PIECE):
            await answer.write(piece)
            unsent.append(request.transport.get_write_buffer_size())
        return answer

    app.router.add_get("/plain", plain)
    app.router.add_get("/file", file)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/abandoned/{framing}", abandoned)
    app.router.add_post("/echo", echo)
    app.router.add_get("/big", big)
    return app


@dataclass
class Served:
    address: tuple[str, int]
    app: web.Application


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        return pytest.importorskip("uvloop").new_event_loop()
    return asyncio.new_event_loop()


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The front on 127.0.0.1 with the application above behind it, its loop
    in a thread of this process."""
    file_path = tmp_path_factory.mktemp("relay") / "file.bin"
    file_path.write_bytes(FILE)
    app = app_behind_the_front(file_path)
    loop = new_loop(request.param)
    thread = threading.Thread(target=loop.run_forever, name="front-loop", daemon=True)
    thread.start()

    async def start() -> tuple[web.AppRunner, FrontServer, tuple[str, int]]:
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        assert runner.server is not None
        # No request here is one the front answers itself: the model service is never reached.
        front = FrontServer(None, TcpAccess(), Metrics(), runner.server,
                            access_log=False, max_request_size=1 << 20, budget=BodyBudget(8 << 20),
                            head_timeout=10, idle_timeout=10)
        sock = socket.create_server(("127.0.0.1", 0))
        front.listen(sock, limit=16)
        return runner, front, sock.getsockname()

    runner, front, address = asyncio.run_coroutine_threadsafe(start(), loop).result(10)

    async def stop() -> None:
        await front.close(2)
        await runner.cleanup()

    try:
        yield Served(address, app)
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_keep_alive_across_relayed_requests(served: Served) -> None:
    """Pins: ``web.Server()`` makes a RequestHandler that takes a transport
    (connection_made) and a request's bytes (data_received); answering a
    request that says "Connection: close" it writes that header, in the
    form the relay takes out (v2.http1.without_connection_close), and
    closes the transport once the answer is written: the relay's sign that
    the client's connection may go on."""
    with Conn(served.address) as c:
        for _ in range(3):
            c.send(get("/plain"))
            status, headers, body = c.answer()
            assert (status, body) == (200, b"plain") and "connection" not in headers, headers


def test_connection_close_asked_by_the_client_is_aiohttps_to_write(served: Served) -> None:
    """Pins: aiohttp writes "Connection: close" on the answer to a request
    that asked for it (the relay passes it on as written, and closes)."""
    with Conn(served.address) as c:
        c.send(get("/plain", "Connection: close\r\n"))
        status, headers, _ = c.answer()
        assert status == 200 and headers["connection"] == "close" and c.closed_by_peer()


def test_a_chunked_answer_ends_with_its_last_chunk(served: Served) -> None:
    """Pins: aiohttp's chunked answer goes through transport.write and ends
    with the last chunk (0 CRLF CRLF) before the transport is closed, so the
    relay sees a whole answer and keeps the connection."""
    with Conn(served.address) as c:
        for _ in range(2):
            c.send(get("/chunked"))
            status, headers, body = c.answer()
            assert status == 200 and headers["transfer-encoding"] == "chunked" and body == b"".join(PARTS)
            assert "connection" not in headers
        c.send(get("/plain"))
        assert c.answer()[2] == b"plain"


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_an_answer_abandoned_half_way_ends_the_connection(served: Served, framing: str) -> None:
    """Pins: when a handler fails after its answer's head went out, aiohttp
    writes nothing more of that answer (no last chunk, no error answer) and
    closes the transport; the relay sees an answer that is not whole and
    ends the client's connection, so no client reads it as complete."""
    with Conn(served.address) as c:
        c.send(get(f"/abandoned/{framing}"))
        while b"\r\n\r\n" not in c.buf:
            assert c._fill()
        head, _ = c.buf.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200")
        while c._fill():
            pass
        rest = c.buf.split(b"\r\n\r\n", 1)[1]
        assert b"x" * 10 in rest and not rest.endswith(b"0\r\n\r\n") and len(rest) < 1000, rest
    with Conn(served.address) as c:   # the front goes on
        c.send(get("/plain"))
        assert c.answer()[2] == b"plain"


def test_a_file_answer_is_written_through_the_relay_without_sendfile(served: Served) -> None:
    """Pins: FileResponse asks loop.sendfile first and, when that raises
    NotImplementedError (asyncio's loop reads the relay's
    _sendfile_compatible, which raises it; uvloop has no sendfile), writes
    the file in chunks through transport.write. asyncio's native sendfile
    would re-register the transport it is given in the loop's map of
    transports: a relay lives for one request, so the second file would
    fail."""
    with Conn(served.address) as c:
        for _ in range(3):
            c.send(get("/file"))
            status, headers, body = c.answer()
            assert status == 200 and body == FILE and "connection" not in headers
        c.send(get("/plain"))
        assert c.answer()[2] == b"plain"


def test_interim_100_continue_is_written_before_the_answer(served: Served) -> None:
    """Pins: for "Expect: 100-continue" aiohttp's router writes
    "HTTP/1.1 100 Continue" through the transport before the handler reads
    the body; the relay passes that interim answer on and waits for the
    real head, and the connection goes on after it."""
    body = os.urandom(50_000)
    with Conn(served.address) as c:
        c.send(f"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n"
               .encode())
        assert c.answer()[0] == 100
        c.send(body)
        status, headers, echoed = c.answer()
        assert status == 200 and echoed == body and "connection" not in headers
        c.send(get("/plain"))
        assert c.answer()[2] == b"plain"


def test_a_chunked_request_hands_the_connection_to_aiohttp(served: Served) -> None:
    """Pins: a RequestHandler given the client's own transport after other
    requests were answered on it (connection_made, then data_received of a
    head and what follows) reads a chunked body and keeps the connection
    alive itself for the next request."""
    body = os.urandom(30_000)
    with Conn(served.address) as c:
        c.send(get("/plain"))
        assert c.answer()[2] == b"plain"
        c.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
        assert c.answer()[2] == body
        c.send(get("/plain"))
        assert c.answer()[2] == b"plain"


def test_a_slow_reader_pauses_the_handlers_writes(served: Served) -> None:
    """Pins: RequestHandler.pause_writing (which the front calls when the
    client's transport is full) makes aiohttp's writer wait in drain, so
    an answer bigger than any buffer is held back, not queued whole in the
    daemon's memory for a client that does not read."""
    unsent = served.app[BIG_WRITES]
    unsent.clear()
    with Conn(served.address) as c:
        c.send(get("/big"))
        assert settled(lambda: len(unsent))   # the client reads nothing until the handler's writes stop
        assert len(unsent) < BIG // PIECE, "the whole answer was queued for a client that did not read"
        status, _, body = c.answer()
        assert status == 200 and len(body) == BIG
        c.send(get("/plain"))
        assert c.answer()[2] == b"plain"
    assert len(unsent) == BIG // PIECE and max(unsent) < 4 << 20, max(unsent)


def settled(count: Callable[[], int], timeout: float = 20) -> bool:
    """Whether ``count`` grew from 0 and then stayed put for half a second."""
    deadline, last, since = time.monotonic() + timeout, -1, time.monotonic()
    while time.monotonic() < deadline:
        now = count()
        if now != last:
            last, since = now, time.monotonic()
        elif now and time.monotonic() - since >= 0.5:
            return True
        time.sleep(0.05)
    return False
