"""Request bodies as the daemon's handlers read them.

The server does not decode bodies itself (auto_decompress is off in
daemon.py): a small gzip body could otherwise grow into gigabytes on the
event loop. request_body() decodes gzip and deflate with the fetcher's
bounded decoder, up to the request limit, in a thread for big bodies, and
reads an identity body with a Content-Length into one buffer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from cartonstore.errors import FetchError, InvalidInput, TooLarge
from cartonstore.fetch.encoding import ContentDecoder, DecodedTooLarge
from cartonstore.v2 import json_codec

IN_THREAD_FROM = 256 * 1024   # smaller bodies: decoding on the loop beats a thread hop
ENCODINGS = ("gzip", "deflate")


def content_coding(header: str | None) -> str:
    """identity, gzip or deflate, from a request's Content-Encoding header."""
    coding = (header or "identity").strip().lower() or "identity"
    if coding not in ("identity", *ENCODINGS):
        raise InvalidInput(f"Content-Encoding {coding!r} is not supported (gzip, deflate or identity)")
    return coding


def too_large(size: int, limit: int) -> TooLarge:
    return TooLarge(f"request body of {size} bytes is larger than max_request_size ({limit} bytes)")


async def request_body(request: web.Request) -> bytes | bytearray:
    """The body, decoded from its Content-Encoding (gzip or deflate). The
    server does not decode on its own (auto_decompress is off): a small
    compressed body could otherwise grow into gigabytes on the event loop.
    Here the decoded size is bounded by the request limit, and big bodies
    are decoded in a thread."""
    coding = content_coding(request.headers.get("Content-Encoding"))
    length = request.content_length
    raw = await _body_of_length(request, length) if length else await request.read()
    return await decoded_body(raw, coding, request.client_max_size)


async def decoded_body(raw: bytes | bytearray, coding: str, limit: int) -> bytes | bytearray:
    """raw decoded from ``coding``, at most ``limit`` bytes of it (TooLarge)."""
    if coding == "identity":
        return raw
    if len(raw) < IN_THREAD_FROM:
        return _decoded(raw, coding, limit)
    return await asyncio.to_thread(_decoded, raw, coding, limit)


def _decoded(raw: bytes | bytearray, coding: str, limit: int) -> bytearray:
    """The fetcher's bounded decoder: it stops a bomb at the limit, in 1 MiB steps."""
    decoder = ContentDecoder(coding, url="the request body", max_output=limit)
    out = bytearray()
    try:
        for piece in decoder.feed(raw):
            out += piece
        decoder.finish()
    except DecodedTooLarge:
        raise TooLarge(f"request body decodes to more than max_request_size ({limit} bytes)") from None
    except FetchError as e:
        raise InvalidInput(f"request body could not be read as {coding} data: {e}") from None
    return out


async def _body_of_length(request: web.Request, length: int) -> bytearray:
    """A Content-Length body, each received chunk copied once into its place
    (request.read() copies a tensor three times: into a growing bytearray,
    when joining chunks, and into bytes)."""
    if length > request.client_max_size:
        raise too_large(length, request.client_max_size)
    request.content.set_read_chunk_size(length)   # fewer pause/resume cycles of the socket
    body = bytearray(length)
    view = memoryview(body)
    got = 0
    while got < length:
        chunk, _ = await request.content.readchunk()
        if not chunk:
            raise InvalidInput(f"request body ended after {got} of its {length} bytes (Content-Length)")
        view[got:got + len(chunk)] = chunk
        got += len(chunk)
    return body


def json_object(raw: bytes | bytearray) -> dict[str, Any]:
    """The JSON object in a request body; {} for an empty one."""
    if not raw.strip():
        return {}
    try:
        data = json_codec.loads(raw)
    except (ValueError, RecursionError) as e:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidInput(f"request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"request body must be a JSON object, got {type(data).__name__}")
    return data


async def body_object(raw: bytes | bytearray) -> dict[str, Any]:
    """json_object, in a thread for a big body (a load may upload files as
    base64 parameters, up to max_request_size)."""
    return json_object(raw) if len(raw) < IN_THREAD_FROM else await asyncio.to_thread(json_object, raw)
