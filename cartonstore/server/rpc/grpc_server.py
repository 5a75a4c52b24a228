"""Starting and stopping the gRPC service: grpcio's asyncio server on a
private Unix socket (reached through the relay that knows callers' uids,
unix_relay.py) and, when [server] grpc_listen says so, on TCP (with the
HTTP listener's TLS and credentials)."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from cartonstore.errors import InvalidInput
from cartonstore.server.api.access import TcpAccess
from cartonstore.server.models.metrics import Metrics
from cartonstore.server.models.service import ModelService

from .servicer import InferenceServicer
from .unix_relay import PeerBook, UnixRelay, private_directory, remove_directory

log = logging.getLogger("cartonstore.server.grpc")
# HTTP/2 frames of up to 16 MiB (the protocol's most; grpcio's default is 16 KiB)
# and a stream window that does not stop a big tensor mid-way: a 4 MiB echo
# costs half the CPU (tests/bench/grpc_section.py measured 51 -> 114 req/s
# between two bare grpcio processes). Clients set their own side.
TRANSPORT_OPTIONS = [("grpc.http2.max_frame_size", (1 << 24) - 1), ("grpc.http2.lookahead_bytes", 64 << 20),
                     ("grpc.http2.bdp_probe", 0)]


@dataclass(frozen=True)
class GrpcTls:
    cert_chain: bytes
    key: bytes
    client_ca: bytes | None = None   # asked for, not required (TcpAccess decides what it opens)


class GrpcServer:
    def __init__(self, service: ModelService, metrics: Metrics, access: TcpAccess, *,
                 unix: socket.socket | None, listen: str | None, tls: GrpcTls | None, max_request_size: int) -> None:
        self.book = PeerBook()
        self.directory: Path | None = None
        self.servicer = InferenceServicer(service, metrics, self.book, access, max_request_size=max_request_size)
        self.unix = unix
        self.listen = listen
        self.tls = tls
        self.max_request_size = max_request_size
        self.bound: list[str] = []
        self._server: grpc.aio.Server | None = None
        self._relay: UnixRelay | None = None

    async def start(self) -> list[str]:
        options = [("grpc.max_receive_message_length", self.max_request_size + (1 << 20)),
                   ("grpc.max_send_message_length", -1), ("grpc.so_reuseport", 0), *TRANSPORT_OPTIONS]
        server = grpc.aio.server(options=options)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, server)
        self._server = server
        if self.unix is not None:
            # grpcio's socket and the relay's, in a directory only the daemon may enter (unix_relay.py)
            self.directory = await asyncio.to_thread(private_directory)   # it sweeps what killed daemons left
            self.book.relayed_from(self.directory)
            server.add_insecure_port(f"unix:{self.directory / 'grpc.sock'}")
        if self.listen:
            try:   # grpcio says a bind that failed with 0 in some versions, RuntimeError in others
                if self.tls is not None:
                    creds = grpc.ssl_server_credentials([(self.tls.key, self.tls.cert_chain)],
                                                        root_certificates=self.tls.client_ca,
                                                        require_client_auth=False)
                    port = server.add_secure_port(self.listen, creds)
                else:
                    port = server.add_insecure_port(self.listen)
            except RuntimeError:
                port = 0
            if not port:
                raise InvalidInput(f"server.grpc_listen: cannot listen on {self.listen} (in use, or not an address "
                                   f"of this host)", subject="server.grpc_listen")
            host = self.listen.rsplit(":", 1)[0]
            self.bound.append(f"grpc{'s' if self.tls else ''}://{host}:{port}")
        await server.start()
        if self.unix is not None:
            self._relay = UnixRelay(self.unix, self.directory / "grpc.sock", self.book)   # type: ignore[operator]
            await self._relay.start()
            self.bound.insert(0, f"grpc+unix:{self.unix.getsockname()}")
        return self.bound

    async def stop(self, grace: float) -> None:
        """Stop taking calls (the relay first: no caller is brought to a
        grpcio that is going); those in flight get ``grace`` seconds."""
        if self._relay is not None:
            self._relay.stop_accepting()
        if self._server is not None:
            await self._server.stop(grace)
        if self._relay is not None:
            await self._relay.close()
        if self.directory is not None:
            await asyncio.to_thread(remove_directory, self.directory)
