"""Request bodies as every door reads them, within one budget.

No door decodes bodies as they come (aiohttp's auto_decompress is off in
daemon.py): a small gzip body could otherwise grow into gigabytes on the
event loop. decoded_body() decodes gzip and deflate with the fetcher's
bounded decoder, up to the request limit, in a thread for big bodies.

Every body the daemon holds, on every route (the front's and aiohttp's), is
counted against server.max_buffered (BodyBudget) before its buffer is
allocated: its Content-Length at once, a chunked body and a decoded one as
they grow. A request that finds no room is answered 503 (BuffersFull) at
once, never made to wait; its reservation is given back when its request
ends, whether answered or cut off by the client.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, TypeVar

from cartonstore.errors import FetchError, InvalidInput, TooLarge, Unavailable
from cartonstore.fetch.http.content_encoding import ContentDecoder, DecodedTooLarge
from cartonstore.format.units import format_size
from cartonstore.v2 import json_codec

Body = TypeVar("Body", bound=bytes | bytearray | memoryview)

IN_THREAD_FROM = 256 * 1024   # smaller bodies: decoding on the loop beats a thread hop
ENCODINGS = ("gzip", "deflate")


class BuffersFull(Unavailable):
    """server.max_buffered is held by the bodies of requests in flight: a
    503 with Retry-After, the request not read."""

    retry_after = 1


class BodyBudget:
    """server.max_buffered: the request body bytes the daemon holds at once,
    every connection's together."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()   # a decoding thread grows its request's reservation

    def reserve(self, size: int = 0) -> Reservation:
        """A reservation of ``size`` bytes (BuffersFull, or TooLarge past the
        whole budget), to grow as the body does and release() when done."""
        reservation = Reservation(self)
        reservation.grow(size)
        return reservation

    def _take(self, size: int) -> None:
        with self._lock:
            if self.held + size <= self.limit:
                self.held += size
                return
            held = self.held
        if size > self.limit:
            raise TooLarge(f"request body needs {size} bytes, more than server.max_buffered ({self.limit} bytes) "
                           "holds for all requests together")
        raise BuffersFull(f"request bodies in flight hold {format_size(held)} of server.max_buffered "
                          f"({format_size(self.limit)}), no room for {format_size(size)} more: retry shortly",
                          subject="server.max_buffered")

    def _give_back(self, size: int) -> None:
        with self._lock:
            self.held -= size


class Reservation:
    """What one request holds of the budget."""

    __slots__ = ("_budget", "size")

    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self.size = 0

    def grow(self, size: int) -> None:
        if size:
            self._budget._take(size)   # noqa: SLF001 - a reservation is a part of its budget
            self.size += size

    def release(self) -> None:
        size, self.size = self.size, 0
        if size:
            self._budget._give_back(size)   # noqa: SLF001 - a reservation is a part of its budget


def content_coding(header: str | None) -> str:
    """identity, gzip or deflate, from a request's Content-Encoding header."""
    coding = (header or "identity").strip().lower() or "identity"
    if coding not in ("identity", *ENCODINGS):
        raise InvalidInput(f"Content-Encoding {coding!r} is not supported (gzip, deflate or identity)")
    return coding


def pick_encoding(accept: str, preferred: tuple[str, ...] = ("zstd", "gzip"), *,
                  wildcard: bool = False) -> str | None:
    """The first of ``preferred`` that the Accept-Encoding header allows
    (q > 0); with ``wildcard``, "*" allows what it does not name."""
    offered = {}
    for item in accept.split(","):
        name, _, params = item.strip().partition(";")
        q = 1.0
        for p in params.split(";"):
            key, _, val = p.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(val)
                except ValueError:
                    q = 0.0
        offered[name.strip().lower()] = q
    default = offered.get("*", 0.0) if wildcard else 0.0
    for name in preferred:
        if offered.get(name, default) > 0:
            return name
    return None


def too_large(size: int, limit: int) -> TooLarge:
    return TooLarge(f"request body of {size} bytes is larger than max_request_size ({limit} bytes)")


async def decoded_body(raw: Body, coding: str, limit: int, reservation: Reservation) -> Body | bytearray:
    """raw decoded from ``coding``, at most ``limit`` bytes of it (TooLarge),
    what it decodes to reserved as it grows."""
    if coding == "identity":
        return raw
    if len(raw) < IN_THREAD_FROM:
        return _decoded(raw, coding, limit, reservation)
    return await asyncio.to_thread(_decoded, raw, coding, limit, reservation)


def _decoded(raw: bytes | bytearray | memoryview, coding: str, limit: int, reservation: Reservation) -> bytearray:
    """The fetcher's bounded decoder: it stops a bomb at the limit, in 1 MiB steps."""
    decoder = ContentDecoder(coding, url="the request body", max_output=limit)
    out = bytearray()
    try:
        for piece in decoder.feed(raw):   # type: ignore[arg-type]  # its decompressors read any buffer
            reservation.grow(len(piece))
            out += piece
        decoder.finish()
    except DecodedTooLarge:
        raise TooLarge(f"request body decodes to more than max_request_size ({limit} bytes)") from None
    except FetchError as e:
        raise InvalidInput(f"request body could not be read as {coding} data: {e}") from None
    return out


def json_object(raw: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The JSON object in a request body; {} for an empty one."""
    if _blank(raw):
        return {}
    try:
        # json_codec calls bytes' methods (decode, count), which a memoryview lacks
        data = json_codec.loads(bytes(raw) if isinstance(raw, memoryview) else raw)
    except (ValueError, RecursionError) as e:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidInput(f"request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"request body must be a JSON object, got {type(data).__name__}")
    return data


def _blank(raw: bytes | bytearray | memoryview) -> bool:
    """Nothing but whitespace (a big body is not copied to tell)."""
    return not len(raw) or (bytes(raw[:1]).isspace() and not bytes(raw).strip())


async def body_object(raw: bytes | bytearray | memoryview) -> dict[str, Any]:
    """json_object, in a thread for a big body (a load may upload files as
    base64 parameters, up to max_request_size)."""
    return json_object(raw) if len(raw) < IN_THREAD_FROM else await asyncio.to_thread(json_object, raw)
