"""The gRPC Unix socket, with its callers known by uid.

grpcio tells a handler nothing of who is on a Unix socket (no
SO_PEERCRED), yet system shared memory needs it: one uid must never use
another's regions. So the public socket is the daemon's own: each
connection accepted there has its uid read, and is relayed to grpcio's
own socket (an abstract address with a random name) from a socket bound
to an abstract address made for it, "cartonstore-grpc-<token>". The
handler reads that address in ``context.peer()`` and finds the uid by the
token (unguessable, and gone when the connection is). Anyone on the host
could connect to grpcio's socket directly: such callers are not in the
book, and the servicer refuses every Unix-socket caller the book does not
know (servicer._peer).
"""

from __future__ import annotations

import asyncio
import secrets
import socket

from cartonstore.server.tensors.shm_regions import Peer, peer_of

PEER_PREFIX = "unix-abstract:cartonstore-grpc-"
UNIX_PEERS = ("unix:", "unix-abstract:")   # how grpcio names a Unix-socket caller
_BUFFER = 4 << 20


class PeerBook:
    """token -> the caller of a relayed connection."""

    def __init__(self) -> None:
        self._peers: dict[str, Peer] = {}

    def add(self, peer: Peer) -> str:
        token = secrets.token_hex(16)
        self._peers[token] = peer
        return token

    def forget(self, token: str) -> None:
        self._peers.pop(token, None)

    def peer_of(self, grpc_peer: str) -> Peer | None:
        """The caller behind grpcio's peer string; None for one that did
        not come through the relay (a TCP caller, or a stranger on grpcio's
        own socket)."""
        if grpc_peer.startswith(PEER_PREFIX):
            return self._peers.get(grpc_peer[len(PEER_PREFIX):])
        return None

    def __len__(self) -> int:
        return len(self._peers)


class _Half(asyncio.Protocol):
    """One side of a relayed connection: what it receives goes to the
    other side's transport; a full other side pauses this one."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: _Half | None = None
        self.pending: list[bytes] = []    # received before the other side was connected
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)

    def data_received(self, data: bytes) -> None:
        other = self.other
        if other is None or other.transport is None:
            self.pending.append(data)
            return
        other.transport.write(data)

    def eof_received(self) -> bool:
        if self.other is not None and self.other.transport is not None and self.other.transport.can_write_eof():
            self.other.transport.write_eof()
        return True

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()


class UnixRelay:
    """Serves ``public`` (the socket clients use), relaying to grpcio on
    the abstract address ``private``."""

    def __init__(self, public: socket.socket, private: bytes, book: PeerBook) -> None:
        self.public = public
        self.private = private
        self.book = book
        self._server: asyncio.AbstractServer | None = None
        self._links: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._accepted, sock=self.public)

    def _accepted(self) -> _Half:
        client = _Half()
        task = asyncio.get_running_loop().create_task(self._link(client))
        self._links.add(task)
        task.add_done_callback(self._links.discard)
        return client

    async def _link(self, client: _Half) -> None:
        await asyncio.sleep(0)   # connection_made has run: the transport is set
        if client.transport is None:
            return
        token = self.book.add(peer_of(client.transport))
        inner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            inner.bind(b"\0cartonstore-grpc-" + token.encode())
            inner.setblocking(False)
            await asyncio.get_running_loop().sock_connect(inner, self.private)
            _, server = await asyncio.get_running_loop().create_unix_connection(_Half, sock=inner)
        except OSError:
            inner.close()
            self.book.forget(token)
            client.transport.close()
            return
        client.other, server.other = server, client
        for half in (client, server):   # what either side sent before they were joined
            for data in half.pending:
                half.other.transport.write(data)   # type: ignore[union-attr]
            half.pending.clear()
        try:
            await asyncio.wait([client.closed, server.closed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            client.transport.close()
            server.transport.close()   # type: ignore[union-attr]
            self.book.forget(token)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._links):
            task.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


def private_address() -> tuple[str, bytes]:
    """grpcio's own socket: (its grpcio URI, its address for connect())."""
    name = f"cartonstore-grpc-server-{secrets.token_hex(16)}"
    return f"unix-abstract:{name}", b"\0" + name.encode()
