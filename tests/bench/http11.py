"""Clients for benches: one keep-alive connection, one request at a time,
on a Unix socket or TCP.

Why not aiohttp's client by default: at ~0.1-0.3 ms per request its own
overhead is as large as the proxy overhead being measured. "raw" is the
daemon's own runner client (cartonstore.server.runner_processes.wire); "aiohttp" the
stock one. The same class talks to every server a bench compares, so
differences are the servers'.
"""

from __future__ import annotations

from dataclasses import dataclass

from cartonstore.server.runner_processes.wire import RunnerClient

ANSWER_LIMIT = 1 << 30   # a bench reads whatever the server under test answers, as a client would


@dataclass(frozen=True)
class Address:
    """Where a server listens: a Unix socket path, or host and port."""

    unix: str | None = None
    host: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        return f"unix:{self.unix}" if self.unix else f"{self.host}:{self.port}"


class Http11Connection:
    """The daemon's own lean client (cartonstore.server.runner_processes.wire), with
    one keep-alive connection: the same code the daemon uses to reach its
    runners, so what it costs is known and small."""

    def __init__(self, address: Address, client: RunnerClient) -> None:
        self.address = address
        self.client = client

    @classmethod
    async def open(cls, address: Address) -> Http11Connection:
        return cls(address, RunnerClient(address.unix or (address.host, address.port)))

    async def request(self, method: str, path: str, body: bytes = b"",
                      headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        return await self.client.request(method, path, headers or {}, [body] if body else [], limit=ANSWER_LIMIT)

    async def close(self) -> None:
        self.client.close()


class AiohttpConnection:
    """The same interface over an aiohttp session with one keep-alive
    connection (--client aiohttp), to see what the stock client costs."""

    def __init__(self, address: Address, session: object) -> None:
        self.address = address
        self.session = session
        self.base = "http://localhost" if address.unix else f"http://{address.host}:{address.port}"

    @classmethod
    async def open(cls, address: Address) -> AiohttpConnection:
        import aiohttp

        connector = aiohttp.UnixConnector(path=address.unix, limit=1) if address.unix \
            else aiohttp.TCPConnector(limit=1)
        # aiohttp offers gzip by default, and the daemon would compress 4 MiB answers: ask for none.
        session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                        headers={"Accept-Encoding": "identity"})
        return cls(address, session)

    async def request(self, method: str, path: str, body: bytes = b"",
                      headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        async with self.session.request(method, self.base + path, data=body, headers=headers) as r:  # type: ignore[attr-defined]  # opened: the session is set
            data = await r.read()
            return r.status, {k.lower(): v for k, v in r.headers.items()}, data

    async def close(self) -> None:
        await self.session.close()  # type: ignore[attr-defined]  # opened: the session is set


CLIENTS = {"raw": Http11Connection, "aiohttp": AiohttpConnection}
