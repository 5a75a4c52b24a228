"""A minimal keep-alive HTTP/1.1 client for benches: one connection, one
request at a time, on a Unix socket or TCP.

Why not aiohttp's client: at ~0.1-0.3 ms per request its own overhead is
as large as the proxy overhead being measured. This one is an
asyncio.Protocol that writes the request and collects the answer by
Content-Length (or chunked framing), nothing else. The same class talks to
every server a bench compares, so differences are the servers'.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True)
class Address:
    """Where a server listens: a Unix socket path, or host and port."""

    unix: str | None = None
    host: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        return f"unix:{self.unix}" if self.unix else f"{self.host}:{self.port}"


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future | None = None
        self.head: tuple[int, dict[str, str]] | None = None
        self.closed: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = exc or ConnectionError("the server closed the connection")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.closed)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is not None and not self.waiter.done():
            try:
                self._complete()
            except Exception as e:  # noqa: BLE001 - hand a framing error to the caller
                self.waiter.set_exception(e)

    def _complete(self) -> None:
        if self.head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            del self.buf[:end + 4]
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            self.head = (status, headers)
        status, headers = self.head
        if "content-length" in headers:
            size = int(headers["content-length"])
            if len(self.buf) < size:
                return
            if len(self.buf) == size:
                body, self.buf = bytes(self.buf), bytearray()
            else:
                body = bytes(self.buf[:size])
                del self.buf[:size]
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._chunked()
            if body is None:
                return
        else:
            raise ValueError(f"response without Content-Length or chunked framing: {headers}")
        self.head = None
        self.waiter.set_result((status, headers, body))  # type: ignore[union-attr]

    def _chunked(self) -> bytes | None:
        """The whole chunked body once its last chunk is in, else None."""
        pos, parts = 0, []
        while True:
            eol = self.buf.find(b"\r\n", pos)
            if eol < 0:
                return None
            size = int(bytes(self.buf[pos:eol]).split(b";")[0], 16)
            if size == 0:
                trailer_end = self.buf.find(b"\r\n\r\n", eol)
                if trailer_end < 0:
                    return None
                del self.buf[:trailer_end + 4]
                return b"".join(parts)
            if len(self.buf) < eol + 2 + size + 2:
                return None
            parts.append(bytes(self.buf[eol + 2:eol + 2 + size]))
            pos = eol + 2 + size + 2


class Http11Connection:
    """One keep-alive connection; ``request`` returns (status, headers, body)
    with header names lower-cased."""

    def __init__(self, address: Address, proto: _Protocol) -> None:
        self.address = address
        self.proto = proto
        self.host = "localhost" if address.unix else f"{address.host}:{address.port}"

    @classmethod
    async def open(cls, address: Address) -> Http11Connection:
        loop = asyncio.get_running_loop()
        if address.unix:
            _, proto = await loop.create_unix_connection(_Protocol, address.unix)
        else:
            _, proto = await loop.create_connection(_Protocol, address.host, address.port)
        return cls(address, proto)

    async def request(self, method: str, path: str, body: bytes = b"",
                      headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        proto = self.proto
        if proto.closed is not None:
            raise proto.closed
        head = [f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in (headers or {}).items()]
        head.append("\r\n")
        proto.waiter = asyncio.get_running_loop().create_future()
        transport = proto.transport
        assert transport is not None
        # Two writes, not one concatenation: a big body is not copied first.
        transport.write("".join(head).encode("latin-1"))
        if body:
            transport.write(body)
        return await proto.waiter

    async def close(self) -> None:
        if self.proto.transport is not None:
            self.proto.transport.close()


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
        async with self.session.request(method, self.base + path, data=body, headers=headers) as r:  # type: ignore[attr-defined]
            data = await r.read()
            return r.status, {k.lower(): v for k, v in r.headers.items()}, data

    async def close(self) -> None:
        await self.session.close()  # type: ignore[attr-defined]


CLIENTS = {"raw": Http11Connection, "aiohttp": AiohttpConnection}
