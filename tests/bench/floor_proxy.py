#!/usr/bin/env python3
"""The floor of any Python proxy in the daemon's place: bytes forwarded
between a client and the runner as they arrive, no HTTP parsed, no
validation, one runner connection per client connection.

bench_infer.py measures it beside the daemon, on the same event loop, so
"overhead above the floor" says what the daemon's own work costs and the
floor says what a second process hop costs on this machine at all.

    python tests/bench/floor_proxy.py LISTEN_SOCKET RUNNER_SOCKET [--loop uvloop|asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal


class _Side(asyncio.Protocol):
    """One end; what it receives is written to its peer's transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream connection makes a stream transport

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.early.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def serve(listen: str, runner: str) -> None:
    loop = asyncio.get_running_loop()

    def accepted() -> _Side:
        client = _Side()

        async def connect() -> None:
            _, upstream = await loop.create_unix_connection(_Side, runner)
            client.peer, upstream.peer = upstream, client
            for data in client.early:
                upstream.transport.write(data)
            client.early.clear()
        loop.create_task(connect())  # noqa: RUF006 - its connection's transport holds it
        return client

    server = await loop.create_unix_server(accepted, listen)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    server.close()
    os.unlink(listen)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("listen")
    ap.add_argument("runner")
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="asyncio")
    a = ap.parse_args()
    if a.loop == "uvloop":
        import uvloop
        uvloop.run(serve(a.listen, a.runner))
    else:
        asyncio.run(serve(a.listen, a.runner))


if __name__ == "__main__":
    main()
