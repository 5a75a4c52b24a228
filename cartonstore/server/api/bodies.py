"""Request bodies as the aiohttp routes read them: request_body() reads an
identity body with a Content-Length into one buffer, a chunked one as it
comes, each reserved from the daemon's BodyBudget (calls/bodies.py) and
decoded from its Content-Encoding there.
"""

from __future__ import annotations

from aiohttp import web

from cartonstore.errors import InvalidInput, TooLarge
from cartonstore.server.calls.bodies import BodyBudget, Reservation, content_coding, decoded_body, too_large
from cartonstore.system.unfilled import unfilled_bytearray

READ_AHEAD = 4 << 20   # what aiohttp may buffer of a body ahead of its reader (its default is 64 KiB)

BODY_BUDGET: web.AppKey[BodyBudget] = web.AppKey("body_budget", BodyBudget)
_RESERVATION = "cartonstore.body_reservation"   # the request's, set by request_body


def release_body(request: web.Request) -> None:
    """Give back what the request's body held of the budget: once its
    handler is done, answered or failed (the app's middleware calls it)."""
    reservation = request.get(_RESERVATION)
    if reservation is not None:
        reservation.release()


async def request_body(request: web.Request) -> bytes | bytearray:
    """The body, decoded from its Content-Encoding (gzip or deflate). The
    server does not decode on its own (auto_decompress is off): a small
    compressed body could otherwise grow into gigabytes on the event loop.
    Here the decoded size is bounded by the request limit, and big bodies
    are decoded in a thread. What it holds is reserved from the daemon's
    BodyBudget until the request's handler is done (release_body)."""
    coding = content_coding(request.headers.get("Content-Encoding"))
    reservation = request[_RESERVATION] = request.app[BODY_BUDGET].reserve()
    length = request.content_length
    raw = await _body_of_length(request, length, reservation) if length else await _body_as_sent(request, reservation)
    return await decoded_body(raw, coding, request.client_max_size, reservation)


async def _body_of_length(request: web.Request, length: int, reservation: Reservation) -> bytearray:
    """A Content-Length body, each received chunk copied once into its place
    (request.read() copies a tensor three times: into a growing bytearray,
    when joining chunks, and into bytes). Its length is reserved before the
    buffer is made, and the buffer's pages are written only as bytes come."""
    if length > request.client_max_size:
        raise too_large(length, request.client_max_size)
    reservation.grow(length)
    request.content.set_read_chunk_size(min(length, READ_AHEAD))   # fewer pause/resume cycles of the socket
    body = unfilled_bytearray(length)
    view = memoryview(body)
    got = 0
    while got < length:
        chunk, _ = await request.content.readchunk()
        if not chunk:
            raise InvalidInput(f"request body ended after {got} of its {length} bytes (Content-Length)")
        view[got:got + len(chunk)] = chunk
        got += len(chunk)
    return body


async def _body_as_sent(request: web.Request, reservation: Reservation) -> bytearray:
    """A body without a length (chunked), reserved chunk by chunk as it grows."""
    body = bytearray()
    async for chunk in request.content.iter_any():
        if len(body) + len(chunk) > request.client_max_size:
            raise TooLarge(f"request body is larger than max_request_size ({request.client_max_size} bytes)")
        reservation.grow(len(chunk))
        body += chunk
    return body
