"""The registry mirror's listener: its own TCP socket and aiohttp runner
beside the daemon's API, started and stopped with it."""

from __future__ import annotations

from aiohttp import web

from cartonstore.oci.pull_through import PullThrough
from cartonstore.server.calls.access import TcpAccess
from cartonstore.server.models.metrics import Metrics
from cartonstore.system.sockets import bind_tcp, describe_socket

from .routes import build_mirror_app


class MirrorServer:
    def __init__(self, pull: PullThrough, access: TcpAccess, listen: str, metrics: Metrics) -> None:
        self.pull = pull
        self.metrics = metrics
        self.access = access
        self.listen = listen
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Bind and serve; returns what it serves on ("mirror+http://HOST:PORT")."""
        sock = bind_tcp(self.listen)
        self._runner = web.AppRunner(build_mirror_app(self.pull, self.access, self.metrics), handle_signals=False,
                                     access_log=None, auto_decompress=False)
        try:
            await self._runner.setup()
            await web.SockSite(self._runner, sock).start()
        except BaseException:
            sock.close()
            raise
        return "mirror+" + describe_socket(sock)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self.pull.close()
