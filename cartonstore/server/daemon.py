"""`cartonstore serve`: run the API on its sockets until SIGTERM.

Startup binds (or inherits) the sockets, then tells systemd READY=1.
SIGTERM/SIGINT stop accepting, let in-flight requests finish (up to the
shutdown timeout), release this daemon's pins and close the store; the
store is consistent at every step because every change in it is atomic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from cartonstore.config.load import LeaseSettings
from cartonstore.config.pulling import standard_puller
from cartonstore.config.runners import RunnerSettings
from cartonstore.errors import InvalidInput
from cartonstore.fetch.http.config import FetchConfig
from cartonstore.oci.pull_through import PullThrough
from cartonstore.server.api.app import build_app
from cartonstore.server.api.bodies import BODY_BUDGET
from cartonstore.server.api.context import ACCESS_LOG, METRICS, TCP_ACCESS
from cartonstore.server.calls.access import TcpAccess
from cartonstore.server.calls.bodies import BodyBudget
from cartonstore.server.http.event_loop import loop_name, run_loop
from cartonstore.server.http.listeners import FrontServer
from cartonstore.server.mirror import MirrorServer
from cartonstore.server.models.metrics import Metrics
from cartonstore.server.models.restore import restore_loaded
from cartonstore.server.models.service import ModelService
from cartonstore.server.rpc.grpc_server import GrpcLimits, GrpcServer, GrpcTls
from cartonstore.server.tensors.arena import DEFAULT_SIZE as ARENA_SIZE
from cartonstore.store import Store
from cartonstore.store.gc.holds import drop_leases_of_gone_owners
from cartonstore.store.gc.plan import GcPolicy
from cartonstore.store.root.owner import hold_identity, owner_token
from cartonstore.system.fd_limit import (
    ListenerNeed,
    connection_caps,
    current_limit,
    descriptors_in_use,
    raise_to_hard_limit,
    reserve_for,
)
from cartonstore.system.hosts import is_loopback
from cartonstore.system.long_lived import settle_heap
from cartonstore.system.malloc_tuning import keep_big_buffers
from cartonstore.system.sockets import bind_tcp, bind_unix, describe_socket, inherited_sockets, notify
from cartonstore.zipfmt import ZipLimits

log = logging.getLogger("cartonstore.server")


@dataclass(frozen=True)
class DaemonSettings:
    root: Path
    socket: Path
    socket_mode: int = 0o660
    socket_group: str | None = None
    listen: str | None = None
    grpc_socket: Path | None = None     # the gRPC service's Unix socket (None: no gRPC)
    grpc_listen: str | None = None      # and its TCP listener
    mirror_listen: str | None = None    # the pull-through registry mirror's TCP listener (None: no mirror)
    mirror_upstream: str = ""           # the registry it asks when a request names none (?ns=)
    mirror_tag_ttl: float = 30.0
    restore_loaded: bool = True         # load again what this daemon (its identity) had loaded
    id: str = ""                        # server.id, the identity its loaded models are kept under ("": socket)
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    fetch: FetchConfig = field(default_factory=FetchConfig)
    zip_limits: ZipLimits = field(default_factory=ZipLimits)
    max_request_size: int = 256 << 20
    max_buffered: int = 1 << 30         # request bodies in memory at once, all connections (calls/bodies.py)
    max_connections: int = 4096         # per listener, lowered to fit the descriptor limit (system/fd_limit.py)
    max_connections_per_peer: int = 256   # per remote address on a TCP listener
    head_timeout: float = 10.0          # a request's whole head (gRPC: TLS and HTTP/2 preface), from accept
    idle_timeout: float = 75.0          # a connection with no request (gRPC: no RPC) in flight
    shared_memory_over_tcp: bool = False
    allow_tcp_local_sources: bool = False   # TCP callers may name paths on this host (read with the daemon's rights)
    arena_size: int = ARENA_SIZE        # the tensor arena shared with runners (0: none)
    check_workers: int = 0              # processes checking big JSON infer requests (0: a thread)
    shutdown_timeout: float = 10.0
    access_log: bool = False   # a line per request (errors always get one)
    gc: GcPolicy = field(default_factory=GcPolicy)
    gc_interval: float = 600.0
    response_cache_size: int = 0        # [cache] size: bytes of answers kept (0: no response cache)
    runners: RunnerSettings = field(default_factory=RunnerSettings)
    tls_cert: Path | None = None        # TLS on TCP listeners...
    tls_key: Path | None = None
    tls_client_ca: Path | None = None   # ...asking clients for a certificate this CA signed (a credential)
    token: str = ""                     # server.token: the Bearer token TCP callers must send

    @property
    def identity(self) -> str:
        """server.id, else the socket's path (the default a restart on the same socket keeps)."""
        return self.id or str(self.socket)

    def tcp_access(self) -> TcpAccess:
        """What TCP callers must show. A listener beyond loopback with no
        credential configured would let anyone who reaches it load code:
        refused (InvalidInput) before anything is bound."""
        access = TcpAccess(self.token, self.fetch.peers.token, self.tls_client_ca is not None)
        for key, listen in (("server.listen", self.listen), ("server.grpc_listen", self.grpc_listen),
                            ("mirror.listen", self.mirror_listen)):
            if listen and not access.has_credential and not is_loopback(listen.rsplit(":", 1)[0]):
                raise InvalidInput(f"{key} {listen!r} is not a loopback address and no credential is "
                                   "configured: set server.token (or server.token_file), or server.tls_client_ca, "
                                   "so that TCP callers must authenticate", subject=key)
        if self.mirror_listen and not access.token and not is_loopback(self.mirror_listen.rsplit(":", 1)[0]):
            raise InvalidInput(f"mirror.listen {self.mirror_listen!r} is not a loopback address: the mirror beyond "
                               "loopback needs server.token (or server.token_file), sent by callers as a Bearer "
                               "token", subject="mirror.listen")
        return access

    def grpc_tls(self) -> GrpcTls | None:
        """The TLS of the gRPC listener: the HTTP listener's files."""
        if self.tls_cert is None:
            return None
        try:
            chain = self.tls_cert.read_bytes()
            key = self.tls_key.read_bytes() if self.tls_key is not None else chain
            ca = self.tls_client_ca.read_bytes() if self.tls_client_ca is not None else None
        except OSError as e:
            raise InvalidInput(f"server TLS for gRPC: cannot read {e.filename} ({e.strerror})") from None
        return GrpcTls(chain, key, ca)

    def tls_context(self) -> ssl.SSLContext | None:
        """The TCP listeners' TLS context; None for plain HTTP. A client
        certificate is asked for but optional: only /v1/blobs requires it."""
        if self.tls_cert is None:
            if self.tls_key is not None or self.tls_client_ca is not None:
                raise InvalidInput("server.tls_key and server.tls_client_ca need server.tls_cert (TLS on the "
                                   "TCP listener)", subject="server.tls_cert")
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(str(self.tls_cert), str(self.tls_key) if self.tls_key else None)
            if self.tls_client_ca is not None:
                context.load_verify_locations(cafile=str(self.tls_client_ca))
                context.verify_mode = ssl.CERT_OPTIONAL
        except (OSError, ssl.SSLError) as e:
            raise InvalidInput(f"server TLS: cannot load {self.tls_cert}, {self.tls_key} or {self.tls_client_ca} "
                               f"({getattr(e, 'strerror', None) or e})") from None
        return context


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {"time": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
                "message": record.getMessage()}
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data)


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


class Daemon:
    def __init__(self, settings: DaemonSettings) -> None:
        self.settings = settings
        self.bound: list[str] = []
        self._stop = asyncio.Event()
        self._owned_socket: Path | None = None
        self._owned_grpc: Path | None = None
        self._tls: ssl.SSLContext | None = None

    def _sockets(self) -> list[socket.socket]:
        inherited = inherited_sockets()
        if inherited:
            return inherited
        s = self.settings
        socks = [bind_unix(s.socket, mode=s.socket_mode, group=s.socket_group)]
        self._owned_socket = s.socket
        if s.listen:
            try:
                socks.append(bind_tcp(s.listen))
            except BaseException:
                socks[0].close()
                s.socket.unlink(missing_ok=True)
                raise
        return socks

    def _grpc_socket(self) -> socket.socket | None:
        s = self.settings
        if s.grpc_socket is None:
            return None
        sock = bind_unix(s.grpc_socket, mode=s.socket_mode, group=s.socket_group)
        self._owned_grpc = s.grpc_socket
        return sock

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        s = self.settings
        self._tls = s.tls_context()   # a bad certificate stops the start before anything is bound
        access = s.tcp_access()
        # Bind first: a second daemon on a live socket stops at that conflict
        # having started, cleaned and logged nothing.
        socks = self._sockets()
        serving = False
        try:
            grpc_sock = self._grpc_socket()
        except BaseException:
            self._close_unserved(socks)
            raise
        # What was bound, or handed over by systemd, is held to the rule tcp_access() checked on the settings.
        if public := [sock.getsockname()[0] for sock in socks
                      if sock.family in (socket.AF_INET, socket.AF_INET6) and not is_loopback(sock.getsockname()[0])]:
            if not access.has_credential:
                for sock in socks:
                    sock.close()
                raise InvalidInput(f"a TCP socket on {public[0]} is not loopback and no credential is configured: "
                                   "set server.token (or server.token_file)", subject="server.listen")
            if access.token and self._tls is None:
                log.warning("TCP on %s is plain HTTP beyond loopback: server.token crosses the network in clear; "
                            "set server.tls_cert", ", ".join(public))
        try:
            store = Store(s.root, zip_limits=s.zip_limits)
            identity: int | None = None
            try:
                identity = await asyncio.to_thread(hold_identity, store.layout.locks_dir, s.identity)
                await asyncio.to_thread(owner_token, store.layout.tmp_dir)   # what this daemon owns is named by it
                async with standard_puller(store, s.fetch) as puller:
                    service = ModelService(store, puller, s.leases, Metrics(), s.runners,
                                           shm_over_tcp=s.shared_memory_over_tcp,
                                           max_request_size=s.max_request_size, arena_size=s.arena_size,
                                           check_workers=s.check_workers, daemon_id=s.identity,
                                           allow_tcp_local_sources=s.allow_tcp_local_sources,
                                           budget=s.gc, gc_interval=s.gc_interval,
                                           response_cache_size=s.response_cache_size)
                    if dropped := await asyncio.to_thread(drop_leases_of_gone_owners, store):
                        log.info("dropped %d lease(s) of daemons and processes that are gone", dropped)
                    await asyncio.to_thread(service.runner_host.prepare)   # probes bubblewrap: processes
                    service.runner_host.start_prewarm()
                    app = build_app(service, service.metrics, max_request_size=s.max_request_size,
                                    access_log=s.access_log, tcp_access=access)
                    app[BODY_BUDGET] = BodyBudget(s.max_buffered)
                    http_caps, grpc_limits = self._connection_caps(socks, grpc_sock)
                    serving = True  # from here _serve closes the sockets and unlinks the socket file
                    try:
                        mirror = MirrorServer(PullThrough(puller, s.mirror_upstream, s.mirror_tag_ttl), access,
                                              s.mirror_listen, service.metrics) if s.mirror_listen else None
                        await self._serve(app, service, socks, http_caps,
                                          self._grpc_server(service, access, grpc_sock, grpc_limits), mirror)
                    finally:
                        if grpc_sock is not None:
                            grpc_sock.close()
                        if self._owned_grpc is not None:
                            self._owned_grpc.unlink(missing_ok=True)
            finally:
                store.close()
                if identity is not None:
                    os.close(identity)
        finally:
            if not serving:
                self._close_unserved(socks + ([grpc_sock] if grpc_sock is not None else []))

    def _close_unserved(self, socks: list[socket.socket]) -> None:
        for sock in socks:
            sock.close()
        for owned in (self._owned_socket, self._owned_grpc):
            if owned is not None:
                owned.unlink(missing_ok=True)

    def _grpc_server(self, service: ModelService, access: TcpAccess, sock: socket.socket | None,
                     limits: GrpcLimits) -> GrpcServer | None:
        s = self.settings
        if sock is None and not s.grpc_listen:
            return None
        return GrpcServer(service, service.metrics, access, unix=sock, listen=s.grpc_listen, tls=s.grpc_tls(),
                          max_request_size=s.max_request_size, limits=limits)

    def _connection_caps(self, socks: list[socket.socket],
                         grpc_sock: socket.socket | None) -> tuple[list[int], GrpcLimits]:
        """Each listener's cap on connections: server.max_connections, lowered
        (and logged) where the descriptor limit cannot hold every listener's
        connections beside what the daemon keeps for its own work (its store,
        runners and fetches: system/fd_limit.py), so that a flood on one
        listener never leaves another, or the daemon, without descriptors."""
        s = self.settings
        names = [describe_socket(sock, tls=self._tls is not None and sock.family != socket.AF_UNIX) for sock in socks]
        needs = [ListenerNeed(s.max_connections) for _ in socks]
        if grpc_sock is not None:   # relayed: the client's socket, and both ends of the link to grpcio
            names.append(f"grpc+unix:{grpc_sock.getsockname()}")
            needs.append(ListenerNeed(s.max_connections, descriptors=3))
        if s.grpc_listen:
            names.append(f"grpc on {s.grpc_listen}")
            needs.append(ListenerNeed(s.max_connections, descriptors=3))
        limit, in_use = current_limit(), descriptors_in_use()
        caps = connection_caps(limit, in_use, needs)
        if any(cap < need.wanted for cap, need in zip(caps, needs, strict=True)):
            log.warning("server.max_connections (%d per listener) does not fit the descriptor limit (RLIMIT_NOFILE "
                        "%d, %d in use, %d kept for the store, runners and fetches): %s", s.max_connections, limit,
                        in_use, reserve_for(limit),
                        ", ".join(f"{name} takes at most {cap} connections"
                                  + (f" ({need.descriptors} descriptors each)" if need.descriptors > 1 else "")
                                  for name, cap, need in zip(names, caps, needs, strict=True)))
        grpc_caps = caps[len(socks):]
        unix_cap = grpc_caps.pop(0) if grpc_sock is not None else 0
        tcp_cap = grpc_caps.pop(0) if s.grpc_listen else 0
        return caps[:len(socks)], GrpcLimits(unix=unix_cap, tcp=tcp_cap, per_peer=s.max_connections_per_peer,
                                             head_timeout=s.head_timeout, idle_timeout=s.idle_timeout)

    async def _serve(self, app: web.Application, service: ModelService, socks: list[socket.socket],
                     caps: list[int], grpc_server: GrpcServer | None, mirror: MirrorServer | None) -> None:
        # auto_decompress off: request bodies are decoded by the handlers, bounded (calls/bodies.decoded_body).
        # aiohttp's keep-alive applies only to connections handed to it whole (a chunked request: http/connection.py),
        # and closes one whose next head is not whole in time, however it drips: head_timeout's rule.
        runner = web.AppRunner(app, handle_signals=False, access_log=None, auto_decompress=False,
                               shutdown_timeout=self.settings.shutdown_timeout,
                               keepalive_timeout=self.settings.head_timeout)
        try:
            await runner.setup()
        except BaseException:
            for sock in socks:  # no site holds them yet
                sock.close()
            if self._owned_socket is not None:
                self._owned_socket.unlink(missing_ok=True)
            raise
        assert runner.server is not None
        s = self.settings
        front = FrontServer(service, app[TCP_ACCESS], app[METRICS], runner.server, access_log=app[ACCESS_LOG],
                            max_request_size=s.max_request_size, budget=app[BODY_BUDGET],
                            head_timeout=s.head_timeout, idle_timeout=s.idle_timeout)
        # Not ready until every model to restore was tried: set before any listener takes a probe.
        service.ready = not s.restore_loaded
        try:
            for sock, cap in zip(socks, caps, strict=True):
                tls = self._tls if sock.family != socket.AF_UNIX else None
                front.listen(sock, tls=tls, limit=cap, per_peer=s.max_connections_per_peer)
                self.bound.append(describe_socket(sock, tls=tls is not None))
            if grpc_server is not None:
                self.bound += await grpc_server.start()
            if mirror is not None:
                self.bound.append(await mirror.start())
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
            settle_heap()   # before READY: the first requests must not wait for a full collection
            keeper: asyncio.Future[Any] = asyncio.gather(service.keep_pins(), service.turnover.unload_idle(),
                                    service.turnover.unload_under_pressure(),
                                    service.keep_within_budget(self.settings.gc, self.settings.gc_interval))
            if s.restore_loaded:   # live at once, ready once every model was tried again (restore.py)
                keeper = asyncio.gather(keeper, restore_loaded(service))
            log.info("cartonstore serving %s on %s (%s event loop)", self.settings.root, ", ".join(self.bound),
                     loop_name())
            notify("READY=1\nSTATUS=serving " + " ".join(self.bound))
            await self._stop.wait()
            log.info("shutting down")
            notify("STOPPING=1")
            service.ready = False
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        finally:
            started = time.monotonic()
            # stop accepting, then wait for in-flight requests
            await asyncio.gather(front.close(self.settings.shutdown_timeout),
                                 *([grpc_server.stop(self.settings.shutdown_timeout)] if grpc_server else []),
                                 *([mirror.stop()] if mirror else []))
            for sock in socks:   # those a failed start left unserved; closing a served one again is harmless
                sock.close()
            await runner.cleanup()
            await service.shutdown()
            if self._owned_socket is not None:
                self._owned_socket.unlink(missing_ok=True)
            log.info("stopped in %.2fs", time.monotonic() - started)


def run_daemon(settings: DaemonSettings) -> None:
    keep_big_buffers()
    before, now = raise_to_hard_limit()
    if now != before:
        log.info("descriptor limit (RLIMIT_NOFILE) raised from %d to %d", before, now)
    run_loop(Daemon(settings).run())
