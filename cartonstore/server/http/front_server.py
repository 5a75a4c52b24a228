"""The daemon's listening sockets and their connections (front.py): how
they start, which close when idle, and how they end at shutdown."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time

from aiohttp import web

from cartonstore.server.api.context import SERVICE, TCP_ACCESS

from .front import FrontConnection
from .front_parts import RECV_CHUNK, Mode

KEEPALIVE_TIMEOUT = 75.0   # seconds a connection may stay silent between requests (aiohttp's default)


class FrontServer:
    """The daemon's connections, on any number of listening sockets."""

    def __init__(self, app: web.Application, aiohttp_server: web.Server, *, max_request_size: int) -> None:
        self.app = app
        self.service = app[SERVICE]
        self.access = app[TCP_ACCESS]
        self.aiohttp_server = aiohttp_server
        self.max_request_size = max_request_size
        self.keepalive_timeout = KEEPALIVE_TIMEOUT
        # What every connection receives into (front.py copies out what it keeps at once), and its requests.
        self.scratch = memoryview(bytearray(RECV_CHUNK))
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections: set[FrontConnection] = set()
        self.closing = False
        self._listeners: list[asyncio.AbstractServer] = []
        self._sweeper: asyncio.Task[None] | None = None

    def track(self, task: asyncio.Task[None]) -> None:
        """Hold a request's task until it ends (the loop keeps only weak references)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def listen(self, sock: socket.socket, *, tls: ssl.SSLContext | None = None) -> None:
        """Serve sock; a TCP one over TLS when ``tls`` is given."""
        loop = asyncio.get_running_loop()
        if sock.family == socket.AF_UNIX:
            server = await loop.create_unix_server(lambda: FrontConnection(self), sock=sock)
        else:
            server = await loop.create_server(lambda: FrontConnection(self), sock=sock, ssl=tls)
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
            ours = [conn for conn in self.connections if conn.mode != Mode.HANDED]
            for conn in ours:
                if conn.idle():
                    conn.transport.close()
            if not ours or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.mode != Mode.HANDED:
                conn.transport.abort()

    async def _sweep(self) -> None:
        """Close connections silent for keepalive_timeout between requests
        or in the middle of sending one (a client that stalls)."""
        while True:
            await asyncio.sleep(min(10.0, self.keepalive_timeout / 2))
            limit = time.monotonic() - self.keepalive_timeout
            for conn in list(self.connections):
                if conn.mode in (Mode.HEAD, Mode.BODY, Mode.DISCARD) and conn.last_active < limit:
                    conn.transport.close()
