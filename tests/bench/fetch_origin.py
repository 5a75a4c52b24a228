#!/usr/bin/env python3
"""The origin bench_fetch.py pulls from, in a process of its own.

    python tests/bench/fetch_origin.py --serve DIR --port 0 [--parent-pid PID]

A small aiohttp app bound to 127.0.0.1 serving DIR with ``web.FileResponse``
(sendfile, single Range). ``GET /zstd/<name>`` serves ``DIR/<name>.zst``
with ``Content-Encoding: zstd`` (compression is never enabled on responses,
so aiohttp neither re-compresses nor drops it). ``GET /__stats`` answers
per-path GET/HEAD counts and body bytes as JSON, ``POST /__reset`` clears
them. It prints its port, exits when killed and, as a safety net, when its
parent (the benchmark) goes away.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from aiohttp.abc import AbstractStreamWriter

HERE = Path(__file__).resolve()


def serve(directory: str, port: int, parent_pid: int | None) -> None:
    import asyncio
    import socket

    from aiohttp import web

    root = os.path.realpath(directory)
    paths: dict[str, dict[str, int]] = {}
    totals = {"bytes_sent": 0, "aborted": 0}

    async def stats(_request: web.Request) -> web.Response:
        return web.json_response({"paths": paths, **totals})

    async def reset(_request: web.Request) -> web.Response:
        paths.clear()
        totals.update(bytes_sent=0, aborted=0)
        return web.json_response({"ok": True})

    class CountedFileResponse(web.FileResponse):
        """A FileResponse that adds the body bytes it sends to the stats.
        aiohttp calls prepare() once, after the handler returns; it sends the
        whole body (sendfile)."""

        def __init__(self, path: str, entry: dict[str, int], headers: dict[str, str]) -> None:
            super().__init__(path, headers=headers)
            self.entry = entry

        async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
            try:
                return await super().prepare(request)
            except BaseException:
                totals["aborted"] += 1
                raise
            finally:
                if request.method == "GET" and self.status in (200, 206) and self.content_length:
                    self.entry["bytes"] += self.content_length
                    totals["bytes_sent"] += self.content_length

    async def serve_file(request: web.Request) -> web.StreamResponse:
        entry = paths.setdefault(request.path, {"GET": 0, "HEAD": 0, "bytes": 0})
        entry[request.method] = entry.get(request.method, 0) + 1
        tail = request.match_info["tail"]
        headers = {"Content-Type": "application/octet-stream"}
        if tail.startswith("zstd/"):
            tail = tail[len("zstd/"):] + ".zst"
            headers["Content-Encoding"] = "zstd"
        full = os.path.realpath(os.path.join(root, tail))
        if not full.startswith(root + os.sep) or not os.path.isfile(full):
            raise web.HTTPNotFound()
        return CountedFileResponse(full, entry, headers)

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/__stats", stats)
        app.router.add_post("/__reset", reset)
        app.router.add_get("/{tail:.*}", serve_file)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        await web.SockSite(runner, sock, backlog=1024).start()
        print(sock.getsockname()[1], flush=True)
        try:
            while parent_pid is None or os.getppid() == parent_pid:
                await asyncio.sleep(0.5)
        finally:
            await runner.cleanup()

    asyncio.run(main())


class Origin:
    """The origin process, seen from the benchmark."""

    def __init__(self, directory: Path) -> None:
        cmd = [sys.executable, str(HERE), "--serve", str(directory), "--port", "0",
               "--parent-pid", str(os.getpid())]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.strip():
            self.stop()
            raise SystemExit("the origin process did not start")
        self.port = int(line)
        self.base = f"http://127.0.0.1:{self.port}"
        self._http = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def url(self, path: str) -> str:
        return f"{self.base}/{path.lstrip('/')}"

    def stats(self) -> dict:
        with self._http.open(self.url("/__stats"), timeout=30) as r:
            return json.load(r)

    def reset(self) -> None:
        self._http.open(urllib.request.Request(self.url("/__reset"), data=b"", method="POST"), timeout=30).read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", metavar="DIR", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--parent-pid", type=int, default=None)
    a = ap.parse_args()
    serve(a.serve, a.port, a.parent_pid)
