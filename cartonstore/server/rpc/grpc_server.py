"""Starting and stopping the gRPC service: grpcio's asyncio servers on
private Unix sockets, reached through the relay (unix_relay.py): one for
the daemon's gRPC Unix socket, whose callers it knows by uid, and, when
[server] grpc_listen says so, one for TCP (with the HTTP listener's TLS,
terminated by grpcio, and credentials, checked from a call's headers
before its message is read: tcp_gate.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from cartonstore.errors import CartonStoreError
from cartonstore.server.calls.access import TcpAccess
from cartonstore.server.models.metrics import Metrics
from cartonstore.server.models.service import ModelService
from cartonstore.system.sockets import bind_tcp

from .servicer import InferenceServicer
from .tcp_gate import TcpCallGate
from .unix_relay import GrpcRelay, PeerBook, private_directory, remove_directory

log = logging.getLogger("cartonstore.server.grpc")
# HTTP/2 frames of up to 16 MiB (the protocol's most; grpcio's default is 16 KiB)
# and a stream window that does not stop a big tensor mid-way: a 4 MiB echo
# costs half the CPU (tests/bench/grpc_section.py measured 51 -> 114 req/s
# between two bare grpcio processes). Clients set their own side.
TRANSPORT_OPTIONS = [("grpc.http2.max_frame_size", (1 << 24) - 1), ("grpc.http2.lookahead_bytes", 64 << 20),
                     ("grpc.http2.bdp_probe", 0)]
# Over TCP a caller is unknown until its call's headers are judged (tcp_gate.py), and grpcio takes what
# HTTP/2's windows allow meanwhile; it cannot widen a window once a caller is known. So TCP keeps HTTP/2's
# own 64 KiB (and no BDP probing, which would widen it from what anyone sends): chttp2 opens a connection's
# window to the same 64 KiB, and a call's message beyond it flows as grpcio reads it, that is once its
# caller is let in. A connection holds at most 64 KiB of data and TCP_STREAMS calls' headers (grpcio's
# 16 KiB of metadata each at most) before they are judged: ~0.3 MiB, 80 MiB for one address's 256.
# What it costs a caller with the token, on loopback: a bare grpcio echo 4 MiB x 4 clients 30 against 35
# req/s, x 1 29 against 31; through the daemon, lost in its noise (docs/http-api.md).
TCP_WINDOW = 64 << 10
TCP_STREAMS = 16
TCP_TRANSPORT_OPTIONS = [("grpc.http2.max_frame_size", (1 << 24) - 1), ("grpc.http2.lookahead_bytes", TCP_WINDOW),
                         ("grpc.http2.bdp_probe", 0), ("grpc.max_concurrent_streams", TCP_STREAMS)]


@dataclass(frozen=True)
class GrpcTls:
    cert_chain: bytes
    key: bytes
    client_ca: bytes | None = None   # asked for, not required (TcpAccess decides what it opens)


@dataclass(frozen=True)
class GrpcLimits:
    """How many connections each gRPC listener holds (their descriptors are
    counted by the daemon: three each, relayed) and how long one may wait."""

    unix: int
    tcp: int
    per_peer: int
    head_timeout: float    # TLS handshake and HTTP/2 preface, from accept
    idle_timeout: float    # no RPC in flight (a connection that never sends one included)


class GrpcServer:
    def __init__(self, service: ModelService, metrics: Metrics, access: TcpAccess, *,
                 unix: socket.socket | None, listen: str | None, tls: GrpcTls | None, max_request_size: int,
                 limits: GrpcLimits) -> None:
        self.book = PeerBook()
        self.directory: Path | None = None
        self.servicer = InferenceServicer(service, metrics, self.book, access, max_request_size=max_request_size)
        self.unix = unix
        self.listen = listen
        self.tls = tls
        self.max_request_size = max_request_size
        self.limits = limits
        self.bound: list[str] = []
        self._servers: list[grpc.aio.Server] = []
        self._relay: GrpcRelay | None = None
        self._tcp: socket.socket | None = None

    def _options(self, transport: list[tuple[str, int]]) -> list[tuple[str, int]]:
        # grpcio closes a connection whose handshake (TLS, then the client's HTTP/2 preface and SETTINGS)
        # takes longer than the first, and one with no call in flight for the second (counted from its
        # start, so one that never makes a call goes too): the relay ends the client's side with it.
        return [("grpc.max_receive_message_length", self.max_request_size + (1 << 20)),
                ("grpc.max_send_message_length", -1), ("grpc.so_reuseport", 0),
                ("grpc.server_handshake_timeout_ms", _millis(self.limits.head_timeout)),
                ("grpc.max_connection_idle_ms", _millis(self.limits.idle_timeout)), *transport]

    def _server(self, transport: list[tuple[str, int]],
                interceptors: tuple[grpc.aio.ServerInterceptor, ...] = ()) -> grpc.aio.Server:
        server = grpc.aio.server(options=self._options(transport), interceptors=interceptors)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, server)
        self._servers.append(server)
        return server

    async def start(self) -> list[str]:
        if self.listen:
            self._tcp = _bind_grpc_listen(self.listen)
        try:
            return await self._start()
        except BaseException:
            if self._tcp is not None:
                self._tcp.close()
            raise

    async def _start(self) -> list[str]:
        # grpcio listens only in a directory only the daemon may enter (unix_relay.py); the relay serves
        # the daemon's own sockets.
        self.directory = await asyncio.to_thread(private_directory)   # it sweeps what killed daemons left
        self.book.relayed_from(self.directory)
        self._relay = GrpcRelay(self.directory, self.book)
        if self.unix is not None:   # its callers are let in by the socket's mode and group
            plain = self.directory / "grpc.sock"
            server = self._server(TRANSPORT_OPTIONS)
            server.add_insecure_port(f"unix:{plain}")
            await server.start()
            name = f"grpc+unix:{self.unix.getsockname()}"
            self._relay.serve(self.unix, plain, name=name, limit=self.limits.unix)
            self.bound.append(name)
        if self._tcp is not None:
            server = self._server(TCP_TRANSPORT_OPTIONS, (TcpCallGate(self.servicer),))
            target = self.directory / ("grpc-tls.sock" if self.tls else "grpc-tcp.sock")
            if self.tls is not None:
                creds = grpc.ssl_server_credentials([(self.tls.key, self.tls.cert_chain)],
                                                    root_certificates=self.tls.client_ca, require_client_auth=False)
                server.add_secure_port(f"unix:{target}", creds)
            else:
                server.add_insecure_port(f"unix:{target}")
            await server.start()
            host, port = self._tcp.getsockname()[:2]
            host = f"[{host}]" if ":" in host else host
            name = f"grpc{'s' if self.tls else ''}://{host}:{port}"
            self._relay.serve(self._tcp, target, name=name, limit=self.limits.tcp, per_peer=self.limits.per_peer)
            self.bound.append(name)
        return self.bound

    async def stop(self, grace: float) -> None:
        """Stop taking calls (the relay first: no caller is brought to a
        grpcio that is going); those in flight get ``grace`` seconds."""
        if self._relay is not None:
            self._relay.stop_accepting()
        await asyncio.gather(*(server.stop(grace) for server in self._servers))
        if self._relay is not None:
            await self._relay.close()
        if self._tcp is not None:
            self._tcp.close()
        if self.directory is not None:
            await asyncio.to_thread(remove_directory, self.directory)


def _millis(seconds: float) -> int:
    return max(1, min(int(seconds * 1000), 2**31 - 1))


def _bind_grpc_listen(listen: str) -> socket.socket:
    """The gRPC TCP listener, bound as the HTTP one is: a port in use is
    unavailable (exit 6), an address that is no HOST:PORT invalid (4)."""
    try:
        return bind_tcp(listen)
    except CartonStoreError as e:
        e.message = f"server.grpc_listen: {e.message}"
        e.subject = "server.grpc_listen"
        raise
