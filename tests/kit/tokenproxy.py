"""A registry front that speaks the Bearer token flow, in front of a real
docker-registry: every /v2/ request needs a token for its repository and
action, or gets 401 with ``WWW-Authenticate: Bearer realm=...,service=...,
scope=...``; /token hands tokens out (only to USER:PASSWORD when
``require_user``). Requests are forwarded to the registry as they are."""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
import threading

import aiohttp
from aiohttp import web

from kit.registrykit import PASSWORD, USER

SERVICE = "test-registry"
_REPO = re.compile(r"^/v2/(.+?)/(?:blobs|manifests|tags)/")
HOP_HEADERS = {"host", "authorization", "connection", "transfer-encoding", "content-length"}


class TokenProxy:
    def __init__(self, upstream: str, *, require_user: bool = False, tokens: bool = True,
                 break_patches: int = 0) -> None:
        """``tokens=False`` forwards without asking for any; ``break_patches``:
        that many PATCHes (upload chunks) are cut off after part of their body."""
        self.upstream = upstream            # "127.0.0.1:PORT" of the registry
        self.require_user = require_user
        self.use_tokens = tokens
        self.break_patches = break_patches
        self.broken = 0
        self.tokens: dict[str, set[str]] = {}   # token -> scopes granted
        self.token_requests: list[dict] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()

    @property
    def authority(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _token(self, request: web.Request) -> web.Response:
        given = request.headers.get("Authorization", "")
        user = None
        if given.startswith("Basic "):
            user, _, password = base64.b64decode(given[6:]).decode().partition(":")
            if (user, password) != (USER, PASSWORD):
                return web.json_response({"errors": [{"code": "UNAUTHORIZED"}]}, status=401)
        if self.require_user and user is None:
            return web.json_response({"errors": [{"code": "UNAUTHORIZED"}]}, status=401)
        scopes = request.query.getall("scope", [])
        self.token_requests.append({"user": user, "scopes": scopes, "service": request.query.get("service")})
        token = secrets.token_hex(16)
        self.tokens[token] = {s for scope in scopes for s in _expand(scope)}
        return web.json_response({"token": token, "expires_in": 300})

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        repo = _REPO.match(request.path)
        action = "pull" if request.method in ("GET", "HEAD") else "push"
        need = f"repository:{repo.group(1)}:{action}" if repo else None
        given = request.headers.get("Authorization", "")
        granted = self.tokens.get(given[7:]) if given.startswith("Bearer ") else None
        if self.use_tokens and (granted is None or (need is not None and need not in granted)):
            scope = f',scope="repository:{repo.group(1)}:{"pull" if action == "pull" else "pull,push"}"' if repo else ""
            return web.Response(status=401, headers={
                "WWW-Authenticate": f'Bearer realm="http://{self.authority}/token",service="{SERVICE}"{scope}'})
        if request.method == "PATCH" and self.break_patches > 0:
            self.break_patches -= 1
            self.broken += 1
            await request.content.read(1000)
            assert request.transport is not None
            request.transport.abort()   # the chunk is cut off: the client sees a reset
            raise web.HTTPBadRequest()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        headers["Host"] = self.authority     # the registry builds its Locations from it
        if request.content_length is not None:
            headers["Content-Length"] = str(request.content_length)
        async with (aiohttp.ClientSession(auto_decompress=False) as session,
                    session.request(request.method, f"http://{self.upstream}{request.path_qs}", headers=headers,
                                    data=request.content if request.can_read_body else None,
                                    allow_redirects=False) as r):
            out = web.StreamResponse(status=r.status, headers={k: v for k, v in r.headers.items()
                                                               if k.lower() not in ("transfer-encoding",
                                                                                    "connection")})
            await out.prepare(request)
            async for chunk in r.content.iter_chunked(1 << 16):
                await out.write(chunk)
            await out.write_eof()
            return out

    def __enter__(self) -> TokenProxy:
        def run() -> None:
            self._loop = asyncio.new_event_loop()
            app = web.Application(client_max_size=1 << 30)
            app.router.add_get("/token", self._token)
            app.router.add_route("*", "/v2/{tail:.*}", self._forward)
            self._runner = web.AppRunner(app)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            self._started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _expand(scope: str) -> set[str]:
    """repository:r:pull,push -> {repository:r:pull, repository:r:push}."""
    kind, _, rest = scope.partition(":")
    name, _, actions = rest.rpartition(":")
    return {f"{kind}:{name}:{a}" for a in actions.split(",")}
