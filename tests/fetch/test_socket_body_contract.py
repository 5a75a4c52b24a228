"""What fetch/http/socket_body.py relies on of aiohttp's client, pinned.

take_socket() reaches under a ClientResponse: its connection's transport
and protocol, the socket behind the transport, the body's StreamReader
drained with read_nowait(), and ResponseHandler.pause_reading(); the
response is closed afterwards, not released. None of that is aiohttp's
documented API, and aiohttp is pinned to one minor release for it
(pyproject.toml): each test here names the aiohttp behaviour it pins,
and fails if that changes.

A real aiohttp ClientSession, on asyncio's loop and on uvloop's (the
daemon's), against a raw HTTP/1.1 server on 127.0.0.1 that counts its
connections.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest
from kit.daemonkit import wait_for

from cartonstore.fetch.http import socket_body
from cartonstore.fetch.http.socket_body import receive_directly, take_socket

BODY = os.urandom(socket_body.DIRECT_MIN + (3 << 20) + 7)
SMALL = b"a small body"
STALL_AT = 1 << 20


class BodyServer:
    """Answers GET /big with BODY, /small with SMALL, /stalled with BODY
    paused for a second after STALL_AT bytes; keep-alive, a thread per
    connection. Counts the connections it accepted and those that ended."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = self.ended = 0
        self.threads = [threading.Thread(target=self.accept, daemon=True)]
        self.threads[0].start()

    def accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:   # closed: done
                return
            self.accepted += 1
            thread = threading.Thread(target=self.serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def serve(self, conn: socket.socket) -> None:
        with conn:
            request = b""
            try:
                while True:
                    while b"\r\n\r\n" not in request:
                        got = conn.recv(65536)
                        if not got:
                            return
                        request += got
                    head, request = request.split(b"\r\n\r\n", 1)
                    path = head.split(b" ")[1]
                    body = SMALL if path == b"/small" else BODY
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                    if path == b"/stalled":
                        conn.sendall(body[:STALL_AT])
                        time.sleep(1)
                        body = body[STALL_AT:]
                    conn.sendall(body)
            except OSError:   # the client closed mid-answer
                return
            finally:
                self.ended += 1

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)   # wakes the accept under way; close alone does not
        self.listener.close()
        for thread in self.threads:
            thread.join(10)


@pytest.fixture
def server() -> Iterator[BodyServer]:
    s = BodyServer()
    try:
        yield s
    finally:
        s.close()


LOOPS = ["asyncio", "uvloop"]


def run_on(loop: str, main: Callable[[], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        return await main()

    if loop == "uvloop":
        return pytest.importorskip("uvloop").run(run())
    return asyncio.run(run())


async def whole_body(taken: socket_body.TakenSocket, raw: aiohttp.ClientResponse, url: str) -> bytes:
    """What socket_body hands over: the head aiohttp had buffered, then the socket's bytes."""
    got = bytearray()
    await receive_directly(taken, raw, len(BODY), got.extend, url=url, stall_timeout=10)
    return bytes(got)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_plain_tcp_response_shows_its_socket(server: BodyServer, loop: str) -> None:
    """Pins: a ClientResponse whose body is unread has ``connection`` with
    ``transport`` and ``protocol``; the transport's extra info has no
    "sslcontext" nor "ssl_object" over plain TCP, and a "socket" whose
    fileno() and type (SOCK_STREAM) are the connection's."""
    async def main() -> None:
        async with aiohttp.ClientSession() as session, session.get(server.url + "/big") as raw:
            transport, protocol = raw.connection.transport, raw.connection.protocol
            assert transport is not None and protocol is not None and not transport.is_closing()
            assert transport.get_extra_info("sslcontext") is None and transport.get_extra_info("ssl_object") is None
            sock = transport.get_extra_info("socket")
            assert sock.type == socket.SOCK_STREAM and sock.fileno() >= 0
            assert sock.getpeername()[1] == server.listener.getsockname()[1]
            taken = take_socket(raw, len(BODY), raw.headers)
            assert taken is not None and taken.fd >= 0
            assert await whole_body(taken, raw, server.url) == BODY

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_what_aiohttp_buffered_and_the_socket_make_the_whole_body(server: BodyServer, loop: str) -> None:
    """Pins: with the body past aiohttp's buffer limits (its flow control
    has paused reading), read_nowait() hands over every byte aiohttp took
    off the socket, and the reading it resumes as the buffer drains takes
    nothing before ResponseHandler.pause_reading() stops the transport,
    synchronously: nothing more reaches the StreamReader, and the socket
    holds exactly the rest, byte for byte."""
    async def main() -> None:
        async with aiohttp.ClientSession() as session, session.get(server.url + "/big") as raw:
            await asyncio.sleep(0.3)   # the server sends at once: aiohttp fills its buffers and pauses
            taken = take_socket(raw, len(BODY), raw.headers)
            assert taken is not None
            buffered = b"".join(taken.head)
            assert 0 < len(buffered) < len(BODY) - (1 << 20)
            await asyncio.sleep(0.2)   # the loop runs: a transport still reading would feed the reader
            assert raw.content.read_nowait() == b""
            assert await whole_body(taken, raw, server.url) == BODY

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_pause_reading_stops_the_read_timeout(server: BodyServer, loop: str) -> None:
    """Pins: ResponseHandler.pause_reading() drops its sock_read timer, so a
    body taken from aiohttp is not failed by aiohttp's timeout while the
    stream's thread waits on the socket (socket_body keeps the stall
    timeout itself)."""
    async def main() -> None:
        timeout = aiohttp.ClientTimeout(sock_read=0.2)
        async with aiohttp.ClientSession(timeout=timeout) as session, \
                session.get(server.url + "/stalled") as raw:
            taken = take_socket(raw, len(BODY), raw.headers)
            assert taken is not None
            await asyncio.sleep(0.6)   # the server is silent (a second): past sock_read, with the loop running
            assert raw.content.exception() is None
            assert await whole_body(taken, raw, server.url) == BODY

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_closing_a_taken_response_closes_its_connection(server: BodyServer, loop: str) -> None:
    """Pins: ClientResponse.close() on a response whose body aiohttp did not
    see whole ends its connection; it is not put back in the pool, and the
    next request takes a new one. (A body read through aiohttp keeps its
    connection: the count is the pool's.)"""
    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                async with session.get(server.url + "/small") as raw:
                    assert await raw.read() == SMALL
            assert server.accepted == 1
            async with session.get(server.url + "/big") as raw:
                taken = take_socket(raw, len(BODY), raw.headers)
                assert taken is not None
                assert await whole_body(taken, raw, server.url) == BODY
            async with session.get(server.url + "/small") as raw:
                assert await raw.read() == SMALL
            assert server.accepted == 2

    run_on(loop, main)
    assert wait_for(lambda: server.ended == 2, 10), server.ended
