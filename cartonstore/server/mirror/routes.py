"""The routes of the registry mirror: ``GET /v2/``, ``GET``/``HEAD``
``/v2/<name>/manifests/<reference>`` and ``/v2/<name>/blobs/<digest>``
(Range on blobs), ``?ns=<registry>`` naming the upstream as containerd
sends it. A blob still arriving from upstream is streamed as it lands;
where it turns out not to be what its digest says, the answer is cut
(the connection aborted), never ended cleanly. Read-only: every other method is 405. Errors are the
distribution spec's JSON, ``{"errors": [{"code", "message", "detail"}]}``."""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import web

from cartonstore.errors import CartonStoreError, FetchNotFound, InvalidInput, NotFound, Unauthenticated
from cartonstore.oci.arriving import Arriving
from cartonstore.oci.pull_through import PullThrough
from cartonstore.server.calls.access import REALM, TcpAccess, check_mirror
from cartonstore.server.models.metrics import Metrics

# The distribution spec's <name> grammar.
NAME = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*")
ROUTE = re.compile(r"(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)")
API_VERSION = {"Docker-Distribution-API-Version": "registry/2.0"}


def error(status: int, code: str, message: str, headers: dict | None = None) -> web.Response:
    return web.json_response({"errors": [{"code": code, "message": message, "detail": None}]}, status=status,
                             headers={**API_VERSION, **(headers or {})})


def build_mirror_app(pull: PullThrough, access: TcpAccess, metrics: Metrics) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            check_mirror(access, request.headers.get("Authorization"))
        except Unauthenticated as e:
            return error(401, "UNAUTHORIZED", e.message, {"WWW-Authenticate": REALM})
        if request.method not in ("GET", "HEAD"):
            return error(405, "UNSUPPORTED", f"{request.method} {request.path}: this mirror is read-only (pull only)",
                         {"Allow": "GET, HEAD"})
        tail = request.match_info["tail"]
        if tail == "":
            return web.json_response({}, headers=API_VERSION)
        found = ROUTE.fullmatch(tail)
        if found is None:
            return error(404, "UNSUPPORTED", f"{request.path} is not a route of the distribution API's pull side")
        name, kind, ref = found["name"], found["kind"], found["ref"]
        if not NAME.fullmatch(name):
            return error(400, "NAME_INVALID", f"{name!r} is not a repository name")
        ns = request.query.get("ns") or None
        try:
            if kind == "manifests":
                return await _manifest(request, pull, metrics, ns, name, ref)
            return await _blob(request, pull, metrics, ns, name, ref)
        except (FetchNotFound, NotFound) as e:
            code = "MANIFEST_UNKNOWN" if kind == "manifests" else "BLOB_UNKNOWN"
            return error(404, code, e.message)
        except InvalidInput as e:
            code = "DIGEST_INVALID" if ref.startswith("sha256:") or kind == "blobs" else "MANIFEST_INVALID"
            return error(400, code, e.message)
        except CartonStoreError as e:   # upstream unreachable or refusing, bytes that do not match their digest
            return error(502, "UNKNOWN", f"upstream: {e.message}")

    app = web.Application()
    app.router.add_route("*", "/v2/{tail:.*}", handle)
    return app


async def _manifest(request: web.Request, pull: PullThrough, metrics: Metrics, ns: str | None, name: str,
                    ref: str) -> web.Response:
    manifest = await pull.manifest(ns, name, ref, head=request.method == "HEAD")
    headers = {**API_VERSION, "Docker-Content-Digest": manifest.digest, "Content-Type": manifest.media_type}
    if request.method == "HEAD":
        return web.Response(headers={**headers, "Content-Length": str(len(manifest.raw))})
    metrics.count_served("mirror", len(manifest.raw))
    return web.Response(body=manifest.raw, headers=headers)


async def _blob(request: web.Request, pull: PullThrough, metrics: Metrics, ns: str | None, name: str,
                digest: str) -> web.StreamResponse:
    headers = {**API_VERSION, "Docker-Content-Digest": digest, "Content-Type": "application/octet-stream"}
    if request.method == "HEAD":   # never a download: the size is the store's, or upstream's HEAD
        size = await pull.blob_size(ns, name, digest)
        return web.Response(headers={**headers, "Content-Length": str(size)})
    found: Path | Arriving = (await pull.stored_blob(ns, name, digest) if "Range" in request.headers
                              else await pull.blob(ns, name, digest))
    if isinstance(found, Arriving):
        return await _stream(request, metrics, found, headers)
    metrics.count_served("mirror", found.stat().st_size)   # the whole file, as /v1/blobs counts it
    response = web.FileResponse(found, headers=headers)
    response.enable_compression = lambda *a, **k: None  # type: ignore[method-assign]  # bytes as stored
    return response


async def _stream(request: web.Request, metrics: Metrics, arriving: Arriving, headers: dict) -> web.StreamResponse:
    """The blob's bytes as they land. Its first byte is waited for before
    the headers go out, so a blob upstream lacks is still a 404."""
    pieces = arriving.chunks()
    first = await anext(pieces, b"")
    response = web.StreamResponse(headers=headers)
    if arriving.size is not None:
        response.content_length = arriving.size
    await response.prepare(request)
    sent = 0
    try:
        piece = first
        while piece:
            await response.write(piece)
            sent += len(piece)
            piece = await anext(pieces, b"")
    except CartonStoreError:   # after the headers only a cut connection tells the caller the bytes are wrong
        if request.transport is not None:
            request.transport.abort()
        return response
    finally:
        await pieces.aclose()
        metrics.count_served("mirror", sent)
    await response.write_eof()
    return response
