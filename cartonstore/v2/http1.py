"""HTTP/1.1 message heads, as the v2 REST protocol carries them: read and
written by the daemon's front connection (server/http/front.py) and by the
runner SDK's server (runner/http_server.py). Pure: bytes in, values out;
no sockets.

Only what those two need is parsed into fields (the daemon's front hands
every request it does not answer itself to aiohttp, head and all), so
nothing here has to cover the whole of RFC 9112.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from http import HTTPStatus

MAX_HEAD = 64 * 1024          # request line and headers together (aiohttp allows 8190 per line)
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_NAME_START = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]*")
_LENGTH = re.compile(r"[0-9]{1,18}")   # ASCII digits only ("²".isdigit() is True), at most an exabyte
_REQUEST_LINE = re.compile(rb"^([A-Z]+) (\S+) HTTP/(1\.[01])$")


class BadHead(Exception):
    """A request head that is not HTTP/1.1: answered with ``status`` and the
    connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class RequestHead:
    method: str
    target: str          # as sent: path and query
    version: str         # "1.1" or "1.0"
    headers: dict[str, str]   # lower-case names; repeated fields joined with ", "
    raw: bytes           # the head as received, up to and including the blank line

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
        if not _LENGTH.fullmatch(value):
            raise BadHead(400, "Content-Length is not a length (1 to 18 ASCII digits)")
        return int(value)


_TCHAR = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
# A whole well-formed head in one match: the common case costs one regex, not one per line.
_WELL_FORMED = re.compile(r"([A-Z]+) (\S+) HTTP/(1\.[01])\r\n((?:" + _TCHAR + r"+:[^\r\n\x00]*\r\n)*)\r\n")


def take_head(pending: bytearray) -> bytes | None:
    """The next request head in ``pending`` (taken out of it, blank line
    included), or None until it has all arrived; the empty lines a client
    may send between requests are dropped (RFC 9112 2.2). BadHead (431)
    once more than MAX_HEAD bytes hold no end of head."""
    while pending[:2] == b"\r\n":
        del pending[:2]
    end = pending.find(b"\r\n\r\n")
    if end < 0:
        if len(pending) > MAX_HEAD:
            raise BadHead(431, f"request head longer than {MAX_HEAD} bytes")
        return None
    head = bytes(pending[:end + 4])
    del pending[:end + 4]
    return head


_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


def chunk_size(line: bytes) -> int:
    """The size a chunked body's size line gives (extensions after ';'
    ignored); ValueError for anything but hex digits (int() alone would
    take "-5", "0x5" or "5_0")."""
    text = line.split(b";", 1)[0].strip()
    if not _CHUNK_SIZE.fullmatch(text):
        raise ValueError(f"bad chunk size {text[:20]!r}")
    return int(text, 16)


def parse_request_head(raw: bytes) -> RequestHead:
    """raw: request line and headers, ending with the blank line."""
    text = raw.decode("latin-1")
    match = _WELL_FORMED.fullmatch(text)
    if match is None:
        raise _what_is_wrong(raw)
    headers: dict[str, str] = {}
    for line in match[4].split("\r\n")[:-1]:
        name, _, value = line.partition(":")
        key, value = name.lower(), value.strip(" \t")
        if key in headers:
            if key == "content-length":
                if headers[key] != value:
                    raise BadHead(400, "more than one Content-Length")
                continue
            value = f"{headers[key]}, {value}"
        headers[key] = value
    return RequestHead(match[1], match[2], match[3], headers, raw)


def _what_is_wrong(raw: bytes) -> BadHead:
    """The first fault of a head the regex refused, named by where it is:
    the header's name, never a value (an Authorization line must not reach
    a log or an answer, folded or not)."""
    lines = raw.split(b"\r\n")
    if len(lines) < 3 or lines[-1] or lines[-2]:
        return BadHead(400, "request head does not end with an empty line")
    if _REQUEST_LINE.match(lines[0]) is None:
        return BadHead(400, "bad request line: not 'METHOD TARGET HTTP/1.x'")   # a line sent first may be a header
    previous = None
    for number, line in enumerate(lines[1:-2], start=1):
        name, sep, value = line.partition(b":")
        if line[:1] in (b" ", b"\t"):
            after = f"of {_shown(previous)}" if previous is not None else "with no header before it"
            return BadHead(400, f"bad header line {number}: a folded continuation {after} (obs-fold), "
                                "which HTTP/1.1 does not allow")
        if not sep:
            return BadHead(400, f"bad header line {number}: not 'Name: value' (no ':')")
        if not _TOKEN.match(name):   # the part a name may hold, and no further: the rest may be a value
            return BadHead(400, f"bad header line {number}: the name {_shown(_NAME_START.match(name)[0])} is "  # type: ignore[index]  # it matches the empty string too
                                "followed by a character a header name cannot hold")
        if b"\0" in value or b"\r" in value:
            return BadHead(400, f"bad header value in {_shown(name)}")
        previous = name
    return BadHead(400, "bad request head")


def _shown(name: bytes) -> str:
    """A header name as an error shows it: quoted, and cut short."""
    return repr(name[:60].decode("latin-1"))


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


def response_status(head: bytes) -> int:
    """The status code of a response head (b"HTTP/1.1 200 OK\\r\\n...")."""
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[1][:3].isdigit():
        raise ValueError(f"not a response head: {head[:100]!r}")
    return int(parts[1][:3])
