"""The gRPC listeners, with their callers known and their connections counted.

grpcio tells a handler nothing of who is on a Unix socket (no
SO_PEERCRED), yet system shared memory needs it: one uid must never use
another's regions. So the public socket is the daemon's own: each
connection accepted there has its uid read, and is relayed to grpcio's own
socket, in a directory only the daemon's uid may enter (mode 0700), from a
socket bound to a name made for it: the abstract name "<dir>/<token>". The
handler reads that name in ``context.peer()`` ("unix-abstract:<dir>/<token>")
and finds the uid by the token (random, and forgotten when the connection
ends). Nobody else can connect to grpcio's socket, whatever name they bind;
the servicer still refuses a caller the book does not know (servicer._peer).
An abstract name, not a file: binding a file costs a new inode (~0.2 ms
here) for each connection, and a flood of connections that many.

The TCP listener is the daemon's too, relayed the same way to a grpcio
server of its own (its token marks the caller as TCP's, held to TcpAccess
from each call's headers; TLS passes through to it, and it terminates
it: grpc_server.py, tcp_gate.py): grpcio can neither cap connections
per remote address nor count a connection before its handshake ends, and a
flood it accepts takes descriptors the daemon needs. Here each listener
accepts through a ConnectionGate (a cap per listener, and per address on
TCP); grpcio closes a connection that has not finished its handshake and
HTTP/2 preface within server.head_timeout, or has no RPC in flight for
server.idle_timeout (grpc_server.py), and the relay closes the client's
side with it.

Why grpcio does not listen on an abstract address: those have no
permissions, any local user can list them (/proc/net/unix), connect to
grpcio without the socket's mode and group, or bind the name grpcio lets go
of at shutdown and answer callers the relay still brings. The relay's own
names are never listened on: seeing or squatting one reaches nothing.
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
from cartonstore.system.connection_gate import Admission, ConnectionGate

UNIX_PEERS = ("unix:", "unix-abstract:")   # how grpcio names a Unix-socket caller
_BUFFER = 4 << 20
_MAX_PATH = 100   # sun_path holds 108 bytes; a token's name takes 33 of them after the directory


class PeerBook:
    """token -> the caller of a relayed connection, for connections from
    sockets bound to names under ``directory`` (abstract: "<directory>/<token>")."""

    def __init__(self) -> None:
        self.prefix: str | None = None   # "unix-abstract:<directory>/" once the relay serves
        self._peers: dict[str, Peer] = {}
        self._tcp: set[str] = set()

    def relayed_from(self, directory: Path) -> None:
        self.prefix = f"unix-abstract:{directory}/"

    def add(self, peer: Peer) -> str:
        token = secrets.token_hex(16)
        self._peers[token] = peer
        return token

    def add_tcp(self) -> str:
        """A token for a connection relayed from a TCP listener: an
        anonymous caller, held to TcpAccess by the servicer."""
        token = secrets.token_hex(16)
        self._tcp.add(token)
        return token

    def forget(self, token: str) -> None:
        self._peers.pop(token, None)
        self._tcp.discard(token)

    def _token(self, grpc_peer: str) -> str | None:
        if self.prefix is not None and grpc_peer.startswith(self.prefix):
            return grpc_peer[len(self.prefix):]
        return None

    def peer_of(self, grpc_peer: str) -> Peer | None:
        """The Unix-socket caller behind grpcio's peer string; None for any
        other (one relayed from TCP, or one that came around the relay)."""
        token = self._token(grpc_peer)
        return self._peers.get(token) if token is not None else None

    def over_tcp(self, grpc_peer: str) -> bool:
        """Whether grpcio's peer string names a connection relayed from TCP."""
        return self._token(grpc_peer) in self._tcp



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
    other side's transport; a full other side pauses this one. Either
    side's end is the link's (``ended``)."""

    __slots__ = ("ended", "eof", "other", "paused", "pending", "transport")   # thousands live in a flood

    def __init__(self, ended: asyncio.Future[None], paused: bool = False) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: _Half | None = None
        self.pending: list[bytes] = []    # received before the other side was joined (bounded: see paused)
        self.paused = paused              # reading paused until joined
        self.eof = False                  # this side sends no more
        self.ended = ended

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport: create_connection made it
        if self.paused:
            transport.pause_reading()  # type: ignore[attr-defined]  # a stream transport: create_connection made it
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
        self.eof = True
        return self.pass_eof()

    def pass_eof(self) -> bool:
        """Tell the other side this one sends no more; False (close) once
        neither does: a transport half-closed both ways is never closed by
        the loop, and would hold its descriptor for good."""
        other = self.other
        if other is None or other.transport is None:
            return True   # passed on when the two are joined
        if other.eof:
            return False
        if other.transport.can_write_eof():
            other.transport.write_eof()
        return True

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            self.ended.set_result(None)
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()
        # The transport and this protocol hold each other: broken here, both go when the
        # last reference does, not at the next full collection (a flood's worth at once).
        self.transport = None


class GrpcRelay:
    """Serves the daemon's gRPC listeners (its Unix socket, and TCP when
    configured), relaying each connection to one of grpcio's sockets in
    ``directory`` from a socket bound to "<directory>/<token>" (abstract)."""

    def __init__(self, directory: Path, book: PeerBook) -> None:
        self.directory = directory
        self.book = book
        self._gates: list[ConnectionGate] = []
        self._links: set[asyncio.Task[None]] = set()

    def serve(self, sock: socket.socket, target: Path, *, name: str, limit: int, per_peer: int = 0) -> None:
        """Relay what ``sock`` accepts to grpcio's ``target``: at most
        ``limit`` connections at once, ``per_peer`` from one TCP address (one
        more is closed at once)."""
        over_tcp = sock.family != socket.AF_UNIX
        gate = ConnectionGate(sock, name=name, limit=limit, per_peer=per_peer)
        gate.serve(lambda conn, admission: self._accepted(conn, admission, target, over_tcp))
        self._gates.append(gate)

    def _accepted(self, conn: socket.socket, admission: Admission, target: Path, over_tcp: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._link(conn, admission, target, over_tcp))
        self._links.add(task)
        task.add_done_callback(self._links.discard)

    async def _link(self, conn: socket.socket, admission: Admission, target: Path, over_tcp: bool) -> None:
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        client: _Half | None = None
        server: _Half | None = None
        token: str | None = None
        inner: socket.socket | None = None
        try:
            _, client = await loop.connect_accepted_socket(lambda: _Half(ended, paused=True), sock=conn)
            token = self.book.add_tcp() if over_tcp else self.book.add(peer_of(client.transport))
            inner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            inner.bind(f"\0{self.directory}/{token}")
            inner.setblocking(False)
            await loop.sock_connect(inner, str(target))
            _, server = await loop.create_unix_connection(lambda: _Half(ended), sock=inner)
            inner = None   # the transport owns it
            client.other, server.other = server, client
            for half in (client, server):   # what either side sent before they were joined
                for data in half.pending:
                    half.other.transport.write(data)   # type: ignore[union-attr]  # joined: both halves are connected
                half.pending.clear()
                if half.eof and not half.pass_eof():
                    half.transport.close()   # type: ignore[union-attr]  # joined: both halves are connected
            client.transport.resume_reading()   # type: ignore[union-attr]  # joined: both halves are connected
            await ended
        except OSError:
            pass   # the client left, or grpcio is gone: the connection ends
        finally:
            for half in (client, server):  # type: ignore[assignment]  # server: None until it connects
                if half is not None and half.transport is not None:
                    half.transport.close()
            if client is None and conn.fileno() >= 0:
                conn.close()
            if inner is not None:
                inner.close()
            if token is not None:
                self.book.forget(token)
            if client is not None and server is not None:
                client.other = server.other = None
            admission.release()

    def stop_accepting(self) -> None:
        for gate in self._gates:
            gate.close()

    async def close(self) -> None:
        self.stop_accepting()
        for task in list(self._links):
            task.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)


def remove_directory(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
