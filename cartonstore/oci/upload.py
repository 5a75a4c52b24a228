"""Uploading one blob: monolithic when small, in chunks when large, and
resumed from where the registry says it stands after a failed chunk.

Distribution API: POST starts an upload (its Location names it); a blob up
to ``chunk_size`` goes in one PUT ``?digest=``; a larger one in PATCHes with
``Content-Range: start-end`` (each answered 202 with the new Location and
``Range: 0-last``), then an empty PUT ``?digest=``. After a chunk fails, GET
on the upload's Location answers 204 with the Range the registry holds, and
the upload goes on from there; the bytes are read from the store's blob
file again, never held whole in memory.
"""

from __future__ import annotations

import asyncio
import functools
import re

from cartonstore.errors import FetchError
from cartonstore.fetch.http.client import backoff_delay
from cartonstore.fetch.http.policy import describe

from .registry import Answer, Registry, iter_file, said_by_registry

_RANGE = re.compile(r"^(?:bytes=)?0-(\d+)$")
OCTETS = "application/octet-stream"


def _with_digest(location: str, digest: str) -> str:
    return f"{location}{'&' if '?' in location else '?'}digest=sha256:{digest}"


def _committed(answer: Answer) -> int:
    """Bytes the registry holds of the upload, from its Range header.
    Distribution answers "0-0" for an empty upload as well as for one byte;
    chunks are at least 1 MiB, so it is read as empty."""
    m = _RANGE.match(answer.headers.get("Range", "").strip())
    last = int(m.group(1)) if m else 0
    return last + 1 if last else 0


async def upload_blob(registry: Registry, path: str, digest: str, size: int, location: str) -> int:
    """Upload the file at path (size bytes, sha256 digest) into the upload
    at location; returns the body bytes sent (a resumed chunk counts again)."""
    chunk = registry.config.registries.chunk_size
    if size <= chunk:
        return await _monolithic(registry, path, digest, size, location)
    sent = 0
    offset = 0
    failures = 0
    while offset < size:
        end = min(size, offset + chunk)
        try:
            answer = await registry.request(
                "PATCH", location, push=True,
                headers={"Content-Type": OCTETS, "Content-Range": f"{offset}-{end - 1}",
                         "Content-Length": str(end - offset)},
                body=functools.partial(iter_file, path, offset, end - offset))
            sent += end - offset
            if answer.status != 202:
                raise FetchError(f"PATCH {describe(location)}: HTTP {answer.status} ({said_by_registry(answer)})",
                                 subject=location, retryable=answer.status >= 500 or answer.status == 416)
            location = registry.location(answer)
            offset = _committed(answer) if answer.headers.get("Range") else end
        except FetchError as e:
            failures += 1
            if not e.retryable or failures > registry.config.retries:
                raise
            await asyncio.sleep(backoff_delay(failures - 1, registry.config, e.retry_after))
            offset, location = await _where_upload_stands(registry, location)
    answer = await registry.request("PUT", _with_digest(location, digest), push=True,
                                    headers={"Content-Length": "0"})
    _check_done(answer, digest)
    return sent


async def _where_upload_stands(registry: Registry, location: str) -> tuple[int, str]:
    answer = await registry.request("GET", location, push=True)
    if answer.status != 204:
        raise FetchError(f"GET {describe(location)}: the registry lost the upload (HTTP {answer.status}: "
                         f"{said_by_registry(answer)})", subject=location)
    return _committed(answer), registry.location(answer) if answer.headers.get("Location") else location


async def upload_bytes(registry: Registry, data: bytes, digest: str, location: str) -> int:
    """A small blob held in memory (an artifact's config), in one PUT."""
    answer = await registry.request("PUT", _with_digest(location, digest), push=True,
                                    headers={"Content-Type": OCTETS, "Content-Length": str(len(data))},
                                    body=lambda: data)
    _check_done(answer, digest)
    return len(data)


async def _monolithic(registry: Registry, path: str, digest: str, size: int, location: str) -> int:
    answer = await registry.request("PUT", _with_digest(location, digest), push=True,
                                    headers={"Content-Type": OCTETS, "Content-Length": str(size)},
                                    body=lambda: iter_file(path, 0, size))
    _check_done(answer, digest)
    return size


def _check_done(answer: Answer, digest: str) -> None:
    if answer.status != 201:
        raise FetchError(f"PUT {describe(answer.url)}: the registry did not take blob sha256:{digest} (HTTP "
                         f"{answer.status}: {said_by_registry(answer)})", subject=answer.url,
                         retryable=answer.status >= 500)
