"""GET /v1/blobs/{sha256}: a stored blob for peers and for nodes that list
this one as a mirror; HEAD with Carton-Node is a peer's probe (peers.py).

Identity responses support Range (aiohttp's FileResponse, with sendfile);
when the client accepts zstd or gzip (and asks no Range) the body is
compressed on the fly, chunk by chunk, in a worker thread.

Over TCP, with peers.token set the caller must send it (or server.token)
as a Bearer token, and with server.tls_client_ca it must have shown a
certificate that CA signed (access.py checks both before this route runs);
callers on the Unix socket are this host's and need neither.
"""

from __future__ import annotations

import asyncio
import os
import zlib
from typing import BinaryIO

import zstandard
from aiohttp import web

from cartonstore.errors import InvalidInput, NotFound
from cartonstore.fetch.sources.peers import NODE_HEADER, WAIT_HEADER, PeerSet
from cartonstore.format.digest import is_sha256
from cartonstore.server.calls.bodies import pick_encoding
from cartonstore.server.models.metrics import Metrics
from cartonstore.store import Store

CHUNK = 1 << 20


def _compressor(name: str) -> zstandard.ZstdCompressionObj | zlib._Compress:
    if name == "zstd":
        return zstandard.ZstdCompressor(level=3).compressobj()
    return zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)


async def serve_blob(request: web.Request, store: Store, metrics: Metrics, peers: PeerSet) -> web.StreamResponse:
    """Who may ask over TCP was checked before (access.py: the peer token,
    a client certificate)."""
    digest = request.match_info["digest"]
    if not is_sha256(digest):
        raise InvalidInput(f"{digest!r} is not a sha256 digest (64 lowercase hex)")
    path = store.blobs.path(digest)
    if request.method == "HEAD" and NODE_HEADER in request.headers:
        try:
            wait = float(request.headers.get(WAIT_HEADER, "0"))
        except ValueError:
            raise InvalidInput(f"{WAIT_HEADER}: expected seconds, got {request.headers[WAIT_HEADER]!r}") from None
        status = await peers.answer(digest, request.headers[NODE_HEADER], wait, path.is_file)
        return web.Response(status=status)
    headers = {"ETag": f'"{digest}"', "Cache-Control": "public, max-age=31536000, immutable",
               "Vary": "Accept-Encoding"}
    encoding = None if "Range" in request.headers else pick_encoding(request.headers.get("Accept-Encoding", ""))
    if not path.is_file() and (staged := _open_staged(peers, digest)) is not None:
        return await _stream(request, staged, headers, metrics, encoding)
    if not path.is_file():
        raise NotFound(f"blob {digest} is not in this store", subject=digest)
    if encoding is None:
        # FileResponse sets its own ETag (mtime-size) and answers If-None-Match / If-Range with it.
        response = web.FileResponse(path, headers=headers)
        response.enable_compression = lambda *a, **k: None  # type: ignore[method-assign]  # bytes as stored
        metrics.count_served("blobs", path.stat().st_size)
        return response
    return await _stream(request, open(path, "rb"), headers, metrics, encoding)


def _open_staged(peers: PeerSet, digest: str) -> BinaryIO | None:
    """The blob staged for a carton still being added (peers.py), opened now:
    its commit renames it into the store at any moment, and an open file
    outlives the rename. None when there is none (or it was just committed)."""
    staged = peers.staged_path(digest)
    try:
        return open(staged, "rb") if staged is not None else None
    except FileNotFoundError:
        return None


async def _stream(request: web.Request, f: BinaryIO, headers: dict[str, str], metrics: Metrics,
                  encoding: str | None) -> web.StreamResponse:
    """The whole open file, read (and compressed on the fly, chunk by chunk)
    in worker threads; closed at the end. Without Range: a staged blob is
    served so only in the short window before its commit, and a peer asking
    a Range gets the whole blob, which it handles."""
    with f:
        comp = _compressor(encoding) if encoding else None
        extra = ({"Content-Encoding": encoding} if encoding
                 else {"Content-Length": str(os.fstat(f.fileno()).st_size)})
        response = web.StreamResponse(headers={**headers, "Content-Type": "application/octet-stream", **extra})
        await response.prepare(request)
        while chunk := await asyncio.to_thread(f.read, CHUNK):
            out = await asyncio.to_thread(comp.compress, chunk) if comp is not None else chunk
            if out:
                await response.write(out)
            metrics.count_served("blobs", len(chunk))
        if comp is not None:
            await response.write(comp.flush())
        await response.write_eof()
        return response
