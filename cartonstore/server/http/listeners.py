"""The daemon's listening sockets and their connections (connection.py): how
they are accepted (within each listener's limits), which close when they
are too slow or idle, and how they end at shutdown."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time

from aiohttp import web

from cartonstore.server.calls.access import TcpAccess
from cartonstore.server.calls.bodies import BodyBudget
from cartonstore.server.models.metrics import Metrics
from cartonstore.server.models.service import ModelService
from cartonstore.system.connection_gate import Admission, ConnectionGate
from cartonstore.system.sockets import describe_socket
from cartonstore.v2.http1 import response_head

from .connection import FrontConnection, Mode, error_answer, with_length

RECV_CHUNK = 256 * 1024   # what one read of any connection takes at most (the scratch buffer's size)
SWEEP_BATCH = 64   # connections the sweep closes between two turns of the loop


def refusal(status: int, message: str, extra: dict[str, str] | None = None) -> bytes:
    """A whole answer that ends its connection, for a client that gets no other."""
    answer = error_answer(status, message, extra)
    return response_head(status, with_length(answer), close=True) + answer.payload


class FrontServer:
    """The daemon's connections, on any number of listening sockets."""

    def __init__(self, service: ModelService, access: TcpAccess, metrics: Metrics, aiohttp_server: web.Server, *,
                 access_log: bool, max_request_size: int, budget: BodyBudget, head_timeout: float,
                 idle_timeout: float) -> None:
        """aiohttp_server: what answers the requests the front does not
        (relay.py); access_log: a log line per request answered;
        head_timeout: seconds for a request's whole head, from the accept
        or from its first byte after an answer; idle_timeout: seconds a
        connection may stay silent between requests, or sending a body."""
        self.service = service
        self.access = access
        self.metrics = metrics
        self.access_log = access_log
        self.aiohttp_server = aiohttp_server
        self.max_request_size = max_request_size
        self.budget = budget
        self.head_timeout = head_timeout
        self.keepalive_timeout = idle_timeout
        # What every connection receives into (connection.py copies out what it keeps at once), and its requests.
        self.scratch = memoryview(bytearray(RECV_CHUNK))
        self._tasks: set[asyncio.Task[None]] = set()
        self._handshakes: set[asyncio.Task[None]] = set()
        self.connections: set[FrontConnection] = set()
        self.closing = False
        self._gates: list[ConnectionGate] = []
        self._sweeper: asyncio.Task[None] | None = None

    def track(self, task: asyncio.Task[None]) -> None:
        """Hold a request's task until it ends (the loop keeps only weak references)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def listen(self, sock: socket.socket, *, tls: ssl.SSLContext | None = None, limit: int,
               per_peer: int = 0) -> None:
        """Serve sock (a TCP one over TLS when ``tls`` is given): at most
        ``limit`` connections at once, ``per_peer`` from one TCP address; one
        more is answered 503 and closed (over TLS only closed: it cannot be
        answered before a handshake)."""
        name = describe_socket(sock, tls=tls is not None)
        over_limit = over_peer = b""
        if tls is None:
            retry = {"Retry-After": "1"}
            over_limit = refusal(503, f"{name} holds its {limit} connections already (server.max_connections): "
                                      "retry shortly", retry)
            over_peer = refusal(503, f"{name} holds {per_peer} connections from your address already "
                                     "(server.max_connections_per_peer): retry shortly", retry)
        gate = ConnectionGate(sock, name=name, limit=limit, per_peer=per_peer, over_limit=over_limit,
                              over_peer_limit=over_peer)
        gate.serve(lambda conn, admission: self._accepted(conn, admission, tls))
        self._gates.append(gate)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def _accepted(self, conn: socket.socket, admission: Admission, tls: ssl.SSLContext | None) -> None:
        task = asyncio.get_running_loop().create_task(self._connect(conn, admission, tls))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _connect(self, conn: socket.socket, admission: Admission, tls: ssl.SSLContext | None) -> None:
        """Set the connection up; a TLS handshake counts against the head's
        time. Its place is given back when it closes (FrontConnection), or
        here when it never got that far (the loop has closed its socket)."""
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(lambda: FrontConnection(self, admission), sock=conn, ssl=tls,
                                               ssl_handshake_timeout=self.head_timeout if tls else None)
        except asyncio.CancelledError:
            admission.release()
            raise
        except Exception:  # noqa: BLE001 - a handshake that failed or took too long: that client is gone
            admission.release()

    async def close(self, timeout: float) -> None:
        """Stop accepting; let requests in flight be answered (up to
        ``timeout``), closing each connection after its answer; then close
        whatever is left."""
        self.closing = True
        for gate in self._gates:
            gate.close()
        for task in list(self._handshakes):
            task.cancel()
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
        """Close connections whose head is not whole head_timeout after it
        began (however it drips), and those silent for keepalive_timeout
        between requests or while sending a body (a client that stalls)."""
        interval = max(0.05, min(self.head_timeout, self.keepalive_timeout) / 10)
        late_head = refusal(408, f"request head not whole within server.head_timeout ({self.head_timeout:g} s)")
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            head_limit, idle_limit = now - self.head_timeout, now - self.keepalive_timeout
            ended = 0
            for conn in list(self.connections):
                if conn.mode == Mode.HEAD and conn.head_since is not None:
                    if conn.head_since >= head_limit:
                        continue
                    conn.give_up(late_head if conn.pending else b"")
                elif conn.mode in (Mode.HEAD, Mode.BODY, Mode.DISCARD, Mode.RELAY_BODY) \
                        and conn.last_active < idle_limit and conn.transport.is_reading():
                    conn.give_up(b"")
                else:
                    continue
                ended += 1
                if ended % SWEEP_BATCH == 0:   # a flood's worth at once would hold the loop from everyone else
                    await asyncio.sleep(0)
