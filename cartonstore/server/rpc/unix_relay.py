"""The gRPC Unix socket, with its callers known by uid.

grpcio tells a handler nothing of who is on a Unix socket (no
SO_PEERCRED), yet system shared memory needs it: one uid must never use
another's regions. So the public socket is the daemon's own: each
connection accepted there has its uid read, and is relayed to grpcio's own
socket from a socket bound to a path made for it, both in a directory only
the daemon's uid may enter (mode 0700). The handler reads that path in
``context.peer()`` ("unix:<dir>/<token>") and finds the uid by the token
(random, and forgotten when the connection ends). Nobody else can connect
to grpcio's socket, nor bind a name there; the servicer still refuses a
Unix-socket caller the book does not know (servicer._peer).

Why not abstract addresses: they have no permissions, any local user can
list them (/proc/net/unix), connect to grpcio without the socket's mode and
group, or bind the name grpcio lets go of at shutdown and answer callers
the relay still brings.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import tempfile
from pathlib import Path

from cartonstore.server.tensors.shm_regions import Peer, peer_of

UNIX_PEERS = ("unix:", "unix-abstract:")   # how grpcio names a Unix-socket caller
_BUFFER = 4 << 20
_MAX_PATH = 100   # sun_path holds 108 bytes; a token's name takes 33 of them after the directory


class PeerBook:
    """token -> the caller of a relayed connection, for connections from
    sockets bound in ``directory``."""

    def __init__(self) -> None:
        self.prefix: str | None = None   # "unix:<directory>/" once the relay serves
        self._peers: dict[str, Peer] = {}

    def relayed_from(self, directory: Path) -> None:
        self.prefix = f"unix:{directory}/"

    def add(self, peer: Peer) -> str:
        token = secrets.token_hex(16)
        self._peers[token] = peer
        return token

    def forget(self, token: str) -> None:
        self._peers.pop(token, None)

    def peer_of(self, grpc_peer: str) -> Peer | None:
        """The caller behind grpcio's peer string; None for one that did
        not come through the relay (a TCP caller, or anyone else)."""
        if self.prefix is not None and grpc_peer.startswith(self.prefix):
            return self._peers.get(grpc_peer[len(self.prefix):])
        return None



def private_directory() -> Path:
    """A new directory only this uid may enter (0700), with a path short
    enough for the sockets in it: the temporary directory ($TMPDIR, a
    private /tmp under systemd's PrivateTmp), else /tmp. Those a killed
    daemon of this uid left there are removed first."""
    base = tempfile.gettempdir()
    if len(base) > _MAX_PATH - 60:
        base = "/tmp"
    _sweep(Path(base))
    return Path(tempfile.mkdtemp(prefix=f"cartonstore-grpc-{os.getpid()}-", dir=base))


def _sweep(base: Path) -> None:
    for left in base.glob("cartonstore-grpc-*-*"):
        try:
            pid = int(left.name.split("-")[2])
            if left.lstat().st_uid != os.getuid() or not left.is_dir() or left.is_symlink():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(left, ignore_errors=True)   # its daemon is gone
        except (ValueError, IndexError, OSError):
            continue   # not ours to judge


class _Half(asyncio.Protocol):
    """One side of a relayed connection: what it receives goes to the
    other side's transport; a full other side pauses this one."""

    def __init__(self, paused: bool = False) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: _Half | None = None
        self.pending: list[bytes] = []    # received before the other side was joined (bounded: see paused)
        self.paused = paused              # reading paused until joined
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.paused:
            transport.pause_reading()  # type: ignore[attr-defined]
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
    """Serves ``public`` (the socket clients use), relaying to grpcio's
    socket ``private`` from sockets bound in its directory."""

    def __init__(self, public: socket.socket, private: Path, book: PeerBook) -> None:
        self.public = public
        self.private = private
        self.book = book
        self._server: asyncio.AbstractServer | None = None
        self._links: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._accepted, sock=self.public)

    def _accepted(self) -> _Half:
        client = _Half(paused=True)
        task = asyncio.get_running_loop().create_task(self._link(client))
        self._links.add(task)
        task.add_done_callback(self._links.discard)
        return client

    async def _link(self, client: _Half) -> None:
        await asyncio.sleep(0)   # connection_made has run: the transport is set
        if client.transport is None:
            return
        token: str | None = None
        inner: socket.socket | None = None
        name = None
        server: _Half | None = None
        try:
            token = self.book.add(peer_of(client.transport))
            name = self.private.parent / token
            inner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            inner.bind(str(name))
            inner.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_connect(inner, str(self.private))
            _, server = await loop.create_unix_connection(_Half, sock=inner)
            inner = None   # the transport owns it
            client.other, server.other = server, client
            for half in (client, server):   # what either side sent before they were joined
                for data in half.pending:
                    half.other.transport.write(data)   # type: ignore[union-attr]
                half.pending.clear()
            client.transport.resume_reading()
            await asyncio.wait([client.closed, server.closed], return_when=asyncio.FIRST_COMPLETED)
        except OSError:
            pass   # the client left, or grpcio is gone: the connection ends
        finally:
            client.transport.close()
            if server is not None and server.transport is not None:
                server.transport.close()
            if inner is not None:
                inner.close()
            if token is not None:
                self.book.forget(token)
            if name is not None:
                name.unlink(missing_ok=True)

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        self.stop_accepting()
        for task in list(self._links):
            task.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


def remove_directory(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
