"""A registry request whose kept-alive connection turned out closed is sent
again on a new connection, not on the next pooled one, which may be as dead
(concurrent uploads each leave one; tinyproxy closes them unannounced).
Against a real server on 127.0.0.1 that answers the first request on each
connection and closes the connection, unanswered, at the second."""

from __future__ import annotations

import asyncio

from kit.fetchkit import fast_config

from cartonstore.fetch.http.client import HttpClient
from cartonstore.oci.reference import parse_reference
from cartonstore.oci.registry import Registry

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def _one_request_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                      seen: list[int]) -> None:
    try:
        await reader.readuntil(b"\r\n\r\n")
        seen.append(1)
        writer.write(ANSWER)
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")   # the second request on this connection: dropped unanswered
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def test_a_request_on_stale_connections_is_sent_again_on_a_new_one() -> None:
    async def go() -> None:
        seen: list[int] = []
        server = await asyncio.start_server(lambda r, w: _one_request_per_connection(r, w, seen), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with HttpClient(fast_config()) as client:
                registry = Registry(client, parse_reference(f"oci://127.0.0.1:{port}/m:t"))
                registry.base = f"http://127.0.0.1:{port}"
                url = registry.url("tags/list")
                # Two at once: two connections, both answered, both left in the pool.
                # POST: aiohttp sends no POST again by itself, as it does a GET.
                answers = await asyncio.gather(*(registry.request("POST", url, authorize=False, body=lambda: b"x")
                                                 for _ in range(2)))
                assert [a.status for a in answers] == [200, 200]
                # Both pooled connections are now dead: the first send meets one, the second must not.
                answer = await registry.request("POST", url, authorize=False, body=lambda: b"x")
                assert answer.status == 200 and len(seen) == 3
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(go())
