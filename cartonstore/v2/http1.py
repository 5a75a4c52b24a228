"""HTTP/1.1 messages, as the v2 REST protocol carries them: request heads
read by the daemon's front connection (server/http/connection.py) and by the
runner SDK's server (runner/http_server.py), response heads read by the
daemon's runner client (server/runner_processes/wire.py) and its relay to aiohttp
(server/http/relay.py), and the one chunked decoder they all use. Pure:
bytes in, values out; no sockets.

The parsing is llhttp's (through httptools, as uvicorn uses it): it decides
what is HTTP/1.1 and refuses what smuggles requests (Content-Length with
Transfer-Encoding, a second Content-Length, obs-fold, bad chunk framing).
Where a head is refused, http1_faults.py names the fault for the answer
by where it is (a header's name, never a value). A head's end is found
here (``take_head``), so that a Content-Length body can be received in
place by the caller, never through the parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from http import HTTPStatus

import httptools

from cartonstore.format.units import format_size

from .http1_faults import LENGTH, BadHead, request_fault, response_fault

MAX_HEAD = 64 * 1024          # request line and headers together (aiohttp allows 8190 per line)
MAX_HEADERS = 100             # header lines of a response, and trailer lines of a chunked body
_VERSIONS = ("1.1", "1.0")
_END_OF_HEAD = b"\r\n\r\n"


class BadChunks(ValueError):
    """A chunked body that breaks its framing, or one of its limits:
    ``broken`` says which ("framing", "size", "chunks", "trailers")."""

    def __init__(self, message: str, broken: str = "framing") -> None:
        super().__init__(message)
        self.broken = broken


class _Message:
    """What llhttp reports of one message, as its callbacks: the head's
    fields, then (fed on) a chunked body's chunks, trailers and end.
    Header names lower-case; a repeated field joined with ", " (``joined``)
    or the last one kept."""

    __slots__ = ("ended", "fields", "headers", "in_body", "joined", "limits", "target", "trailers")

    def __init__(self, *, joined: bool = True) -> None:
        self.target = b""
        self.headers: dict[str, str] = {}
        self.fields = 0
        self.joined = joined
        self.in_body = False
        self.trailers = 0
        self.ended = False
        self.limits: ChunkedBody | None = None

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.in_body:
            self.fields += 1
            key, text = name.decode("latin-1").lower(), value.decode("latin-1").strip(" \t")
            if self.joined and key in self.headers:
                text = f"{self.headers[key]}, {text}"
            self.headers[key] = text
            return
        self.trailers += 1
        if self.trailers > MAX_HEADERS:
            raise BadChunks(f"more than {MAX_HEADERS} trailer lines", "trailers")

    def on_headers_complete(self) -> None:
        self.in_body = True

    def on_chunk_header(self) -> None:
        if self.limits is not None:
            self.limits.count_chunk()

    def on_message_complete(self) -> None:
        self.ended = True


class _KeptMessage(_Message):
    """A message whose chunked body is kept (the relay only watches for its end)."""

    __slots__ = ()

    def on_body(self, data: bytes) -> None:
        if self.limits is not None:
            self.limits.keep(data)


@dataclass
class RequestHead:
    method: str
    target: str          # as sent: path and query
    version: str         # "1.1" or "1.0"
    headers: dict[str, str]   # lower-case names; repeated fields joined with ", "
    raw: bytes           # the head as received, up to and including the blank line
    parsed: tuple[httptools.HttpRequestParser, _Message] | None = field(default=None, repr=False, compare=False)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def connection_tokens(self) -> set[str]:
        return {t.strip().lower() for t in self.headers.get("connection", "").split(",") if t.strip()}

    @property
    def keep_alive(self) -> bool:
        # HTTP/1.0's opt-in keep-alive would need "Connection: keep-alive" on
        # every answer, aiohttp's included: a 1.0 connection ends after one.
        return self.version != "1.0" and "close" not in self.connection_tokens

    def content_length(self) -> int | None:
        """The declared body length; None when there is none (or chunked)."""
        if "transfer-encoding" in self.headers:
            return None
        value = self.headers.get("content-length")
        if value is None:
            return 0
        if not LENGTH.fullmatch(value):
            raise BadHead(400, "Content-Length is not a length (1 to 18 ASCII digits)")
        return int(value)

    def chunked_body(self, limit: int | None = None) -> ChunkedBody:
        """The decoder of this request's chunked body (BadHead 501 for a
        transfer coding other than chunked)."""
        coding = self.headers.get("transfer-encoding", "").lower()
        if coding != "chunked" or self.parsed is None:
            raise BadHead(501, f"Transfer-Encoding {coding!r} is not supported (only chunked)")
        return ChunkedBody(*self.parsed, limit=limit)


def take_head(pending: bytearray) -> bytes | None:
    """The next request head in ``pending`` (taken out of it, blank line
    included), or None until it has all arrived; the empty lines a client
    may send between requests are dropped (RFC 9112 2.2). BadHead (431)
    once more than MAX_HEAD bytes hold no end of head."""
    while pending[:2] == b"\r\n":
        del pending[:2]
    end = pending.find(_END_OF_HEAD)
    if end < 0:
        if len(pending) > MAX_HEAD:
            raise BadHead(431, f"request head longer than {MAX_HEAD} bytes")
        return None
    head = bytes(pending[:end + 4])
    del pending[:end + 4]
    return head


def parse_request_head(raw: bytes) -> RequestHead:
    """raw: request line and headers, ending with the blank line."""
    message = _KeptMessage()
    parser = httptools.HttpRequestParser(message)
    try:
        parser.feed_data(raw)
    except httptools.HttpParserUpgrade:
        pass   # the head is whole; what follows is the other protocol's, handed on with the connection
    except httptools.HttpParserError as e:
        raise request_fault(raw, str(e)) from None
    version = parser.get_http_version()
    if not message.in_body or version not in _VERSIONS:
        raise request_fault(raw, f"HTTP/{version}")
    return RequestHead(parser.get_method().decode("ascii"), message.target.decode("latin-1"), version,
                       message.headers, raw, (parser, message))


@dataclass
class ResponseHead:
    status: int
    version: str           # "1.1" or "1.0"
    headers: dict[str, str]   # lower-case names
    parsed: tuple[httptools.HttpResponseParser, _Message] = field(repr=False, compare=False)

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        return "close" not in connection if self.version == "1.1" else "keep-alive" in connection

    @property
    def is_chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    def chunked_body(self, limit: int | None = None, max_chunks: int | None = None) -> ChunkedBody:
        return ChunkedBody(*self.parsed, limit=limit, max_chunks=max_chunks)


def parse_response_head(raw: bytes, *, keep_body: bool = True) -> ResponseHead:
    """raw: status line and headers, ending with the blank line. ValueError
    (its message for the caller to show) for anything llhttp refuses, or
    more than MAX_HEADERS header lines. ``keep_body``: a chunked body fed
    on is kept (else only its end is seen)."""
    message = _KeptMessage(joined=False) if keep_body else _Message(joined=False)
    parser = httptools.HttpResponseParser(message)
    try:
        parser.feed_data(raw)
    except httptools.HttpParserUpgrade:
        pass
    except httptools.HttpParserError as e:
        raise ValueError(response_fault(raw, str(e))) from None
    version = parser.get_http_version()
    if not message.in_body or version not in _VERSIONS:
        raise ValueError(response_fault(raw, f"HTTP/{version}"))
    if message.fields > MAX_HEADERS:
        raise ValueError(f"answered with {message.fields} header lines, over the {MAX_HEADERS} it may send")
    return ResponseHead(parser.get_status_code(), version, message.headers,
                        (parser, message))


class ChunkedBody:
    """A chunked body, decoded by the llhttp parser that read its head, as
    its bytes are fed: kept (``body``) up to ``limit`` bytes, in at most
    ``max_chunks`` chunks. BadChunks for a body that breaks either, or its
    framing; framing (size lines, extensions, trailers) beyond MAX_HEAD
    bytes plus 64 a chunk is refused too, so a body that sends no data
    costs bounded memory and time (a kept body's: one only watched for
    its end is counted by nobody)."""

    def __init__(self, parser: httptools.HttpRequestParser | httptools.HttpResponseParser, message: _Message, *,
                 limit: int | None = None, max_chunks: int | None = None) -> None:
        self._parser = parser
        self._message = message
        self.limit = limit
        self.max_chunks = max_chunks
        self.body = bytearray()
        self.chunks = 0
        self._framing = 0      # bytes fed that were not body data
        self._bounded = isinstance(message, _KeptMessage)   # a body only watched for its end is aiohttp's own
        self._tail = b""       # the last bytes fed: an end of head may straddle two feeds
        message.limits = self

    @property
    def ended(self) -> bool:
        return self._message.ended

    def count_chunk(self) -> None:
        self.chunks += 1
        if self.max_chunks is not None and self.chunks > self.max_chunks:
            raise BadChunks(f"in more than {self.max_chunks} chunks", "chunks")

    def keep(self, data: bytes) -> None:
        if self.limit is not None and len(self.body) + len(data) > self.limit:
            raise BadChunks(f"chunks of more than {format_size(self.limit)} in all, over the limit of {self.limit} "
                            "bytes", "size")
        self.body += data

    def feed(self, data: bytes | bytearray, start: int = 0) -> int | None:
        """Feed ``data[start:]``; once the body has ended, how many of those
        bytes it took (the rest are the next message's), None until then.

        A chunked body ends just after a CRLF CRLF (its last chunk's line or
        last trailer, then the empty line), so the bytes are fed up to each
        one in turn, and the end is seen where it falls."""
        if self.ended:
            return 0
        ends = self._ends(data, start)
        taken = start
        with memoryview(data) as view:
            for end in ends:
                self._feed(view[taken:end])
                taken = end
                if self.ended:
                    return taken - start
            self._feed(view[taken:])
        self._tail = bytes(data[max(start, len(data) - 3):])
        return taken - start if self.ended else None

    def _ends(self, data: bytes | bytearray, start: int) -> list[int]:
        """Where a CRLF CRLF ends in ``data[start:]``, one begun in the last feed included."""
        ends = []
        probe = self._tail + bytes(data[start:start + 3])
        found = probe.find(_END_OF_HEAD)
        while found >= 0:   # at most two: b"\r\n\r" then b"\n\r\n"
            ends.append(start + found + 4 - len(self._tail))
            found = probe.find(_END_OF_HEAD, found + 1)
        found = data.find(_END_OF_HEAD, start)
        while found >= 0:
            ends.append(found + 4)
            found = data.find(_END_OF_HEAD, found + 1)
        return ends

    def _feed(self, piece: memoryview) -> None:
        before = len(self.body)
        try:
            self._parser.feed_data(piece)
        except httptools.HttpParserCallbackError as e:
            if isinstance(e.__context__, BadChunks):
                raise e.__context__ from None
            raise
        except httptools.HttpParserError as e:
            raise BadChunks(_chunk_fault(str(e))) from None
        self._framing += len(piece) - (len(self.body) - before)
        if self._bounded and self._framing > MAX_HEAD + 64 * self.chunks:
            raise BadChunks(f"chunked framing (size lines, extensions, trailers) over {MAX_HEAD} bytes "
                            f"and 64 a chunk")


def _chunk_fault(reason: str) -> str:
    """llhttp's reason for refusing a chunked body, in the words the answers use."""
    lower = reason.lower()
    if "chunk size" in lower:
        return f"bad chunk size ({reason})"
    if "after chunk" in lower or "chunk data" in lower:
        return f"chunk not followed by CRLF ({reason})"
    return f"bad chunked body ({reason})"


def response_head(status: int, headers: dict[str, str] | list[tuple[str, str]], *,
                  close: bool = False) -> bytes:
    """A status line and headers, ending with the blank line. Content-Length
    is the caller's to give; Connection: close when the connection ends."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    items = headers.items() if isinstance(headers, dict) else headers
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{k}: {v}" for k, v in items if k.lower() != "connection"]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def for_one_request(head: RequestHead) -> bytes:
    """The head again, asking the server behind the front to close after
    its answer (its Connection header replaced by "close"): that close is
    how the front knows aiohttp's answer is complete."""
    lines = head.raw.split(b"\r\n")
    kept = [line for line in lines[1:-2] if line.split(b":", 1)[0].strip().lower() != b"connection"]
    return b"\r\n".join([lines[0], *kept, b"Connection: close", b"", b""])


def without_connection_close(head: bytes) -> bytes:
    """A response head with its Connection header dropped: the front keeps
    the client's connection open although aiohttp closed its side."""
    lines = head.split(b"\r\n")
    return b"\r\n".join(line for line in lines if line.split(b":", 1)[0].strip().lower() != b"connection")
