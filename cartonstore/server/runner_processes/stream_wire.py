"""A decoupled model's stream request to one runner, and its frames read
as hostile (protocol.py, section 12).

Each stream has a connection of its own, which the runner closes after its
final frame. Frames are read only when the caller asks for the next one;
asyncio's StreamReader stops reading the socket once STREAM_BUFFER bytes
wait in it, so a client that does not read fills the kernel's buffers, the
runner blocks on its send and its model on its yield: what one stream
holds in the daemon is bounded, however many responses the model makes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from cartonstore.format.units import format_size
from cartonstore.runner.protocol import FINAL_PARAMETER, MAX_STREAM_RESPONSES, STREAM_FRAME
from cartonstore.system.waiters import within
from cartonstore.v2.framing import HEADER_LENGTH
from cartonstore.v2.http1 import parse_response_head

from .settings import RunnerResponse
from .wire import CONTROL_ANSWER, MAX_HEAD, request_line

STREAM_BUFFER = 64 << 10   # bytes of frames the daemon holds per stream before it stops reading the socket
_BINARY = {"Content-Type": "application/octet-stream"}


class StreamBroken(Exception):
    """The runner broke the stream's framing; the message says how."""


async def open_stream(address: str, path: str, headers: Mapping[str, str],
                      body: Sequence[bytes | memoryview]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The connection with the request sent (OSError when it cannot be)."""
    reader, writer = await asyncio.open_unix_connection(address, limit=STREAM_BUFFER)
    try:
        size = sum(memoryview(p).nbytes for p in body)
        head = [request_line("POST", path), b"Content-Length: %d\r\nConnection: close\r\n" % size]
        head += [f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items()]
        head.append(b"\r\n")
        writer.writelines([b"".join(head), *(memoryview(p).cast("B") for p in body)])
        await writer.drain()
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def read_answer(reader: asyncio.StreamReader, limit: int,
                      next_within: float) -> AsyncGenerator[RunnerResponse, None]:
    """The runner's answer: one error answer (not 200), or each response
    it streams as a binary v2 answer (a mid-stream error as a 500 answer,
    the last); StreamBroken for broken framing, TimeoutError when the
    runner sends nothing for ``next_within`` seconds."""
    try:
        raw = await within(reader.readuntil(b"\r\n\r\n"), next_within)
        head = parse_response_head(raw)
    except asyncio.LimitOverrunError:
        raise StreamBroken(f"answered a head longer than {MAX_HEAD} bytes") from None
    except asyncio.IncompleteReadError:
        raise StreamBroken("closed the connection without answering") from None
    except ValueError as e:
        raise StreamBroken(str(e)) from None
    if head.status != 200:
        length = head.headers.get("content-length")
        if length is None or not length.isdigit() or int(length) > CONTROL_ANSWER:
            raise StreamBroken(f"answered its stream request {head.status} without a Content-Length of at most "
                               f"{CONTROL_ANSWER} bytes")
        body = await _exactly(reader, int(length), next_within, "its error answer")
        yield RunnerResponse(head.status, {"Content-Type": "application/json"}, body)
        return
    if head.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
        raise StreamBroken("answered with a Content-Encoding: runners must not compress their answers")
    for count in range(1, MAX_STREAM_RESPONSES + 2):
        if count > MAX_STREAM_RESPONSES:
            raise StreamBroken(f"streamed more than {MAX_STREAM_RESPONSES} responses to one request")
        header_size, data_size = STREAM_FRAME.unpack(
            await _exactly(reader, STREAM_FRAME.size, next_within, f"response {count}'s frame", before=True))
        if not header_size:
            raise StreamBroken(f"sent response {count} without its JSON header")
        if header_size + data_size > limit:
            raise StreamBroken(f"sent response {count} of {header_size + data_size} bytes, over its limit of "
                               f"{format_size(limit)} (runners.max_response_size)")
        frame = await _exactly(reader, header_size + data_size, next_within, f"response {count}")
        doc = _header(frame, header_size, count)
        if "error" in doc:
            yield RunnerResponse(500, {"Content-Type": "application/json"}, json.dumps(doc).encode())
            return
        if (doc.get("parameters") or {}).get(FINAL_PARAMETER) is True:
            if doc.get("outputs"):
                raise StreamBroken(f"sent outputs in its final response ({count}), which carries none")
            return
        yield RunnerResponse(200, {**_BINARY, HEADER_LENGTH: str(header_size)}, frame)


async def _exactly(reader: asyncio.StreamReader, size: int, seconds: float, what: str, *,
                   before: bool = False) -> bytes:
    try:
        return await within(reader.readexactly(size), seconds)
    except asyncio.IncompleteReadError as e:
        if before and not e.partial:
            raise StreamBroken("closed the connection before its final response") from None
        raise StreamBroken(f"closed the connection in the middle of {what}") from None


def _header(frame: bytes, size: int, count: int) -> dict[str, Any]:
    try:
        doc = json.loads(frame[:size])
    except ValueError as e:
        raise StreamBroken(f"sent response {count} with a JSON header that is not JSON: {e}") from None
    if type(doc) is not dict:
        raise StreamBroken(f"sent response {count} with a JSON header that is not an object")
    if type(doc.get("parameters", {})) is not dict:
        raise StreamBroken(f"sent response {count} whose parameters are not an object")
    return doc
