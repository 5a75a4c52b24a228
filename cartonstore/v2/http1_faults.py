"""What is wrong with an HTTP/1.1 head that llhttp refused (http1.py),
in words an answer can carry: the fault named by where it is (a header's
name, never a request's header value: an Authorization line must not reach
a log or an answer, folded or not). Pure: bytes in, an error out."""

from __future__ import annotations

import re

LENGTH = re.compile(r"[0-9]{1,18}")   # ASCII digits only ("²".isdigit() is True), at most an exabyte
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_NAME_START = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]*")
_REQUEST_LINE = re.compile(rb"^([A-Z]+) (\S+) HTTP/(1\.[01])$")


class BadHead(Exception):
    """A request head that is not HTTP/1.1: answered with ``status`` and the
    connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def request_fault(raw: bytes, reason: str) -> BadHead:
    """The first fault of a head llhttp refused (``reason``, its words),
    named by where it is: the header's name, never a value (an
    Authorization line must not reach a log or an answer, folded or not)."""
    lines = raw.split(b"\r\n")
    if len(lines) < 3 or lines[-1] or lines[-2]:
        return BadHead(400, "request head does not end with an empty line")
    if _REQUEST_LINE.match(lines[0]) is None:
        return BadHead(400, "bad request line: not 'METHOD TARGET HTTP/1.x'")   # a line sent first may be a header
    previous = None
    names: list[bytes] = []
    for number, line in enumerate(lines[1:-2], start=1):
        name, sep, value = line.partition(b":")
        if line[:1] in (b" ", b"\t"):
            after = f"of {_shown(previous)}" if previous is not None else "with no header before it"
            return BadHead(400, f"bad header line {number}: a folded continuation {after} (obs-fold), "
                                "which HTTP/1.1 does not allow")
        if not sep:
            return BadHead(400, f"bad header line {number}: not 'Name: value' (no ':')")
        if not _TOKEN.match(name):   # the part a name may hold, and no further: the rest may be a value
            held = _NAME_START.match(name)
            return BadHead(400, f"bad header line {number}: the name {_shown(held[0] if held else b'')} is "
                                "followed by a character a header name cannot hold")
        if any((c < 0x20 and c != 0x09) or c == 0x7F for c in value):
            return BadHead(400, f"bad header value in {_shown(name)}")
        previous = name
        names.append(name.lower())
    return _framing_fault(names, lines, reason)


def _framing_fault(names: list[bytes], lines: list[bytes], reason: str) -> BadHead:
    """A head whose every line is well formed, refused for how it frames its body."""
    if names.count(b"content-length") > 1:
        return BadHead(400, "more than one Content-Length")
    if b"content-length" in names and b"transfer-encoding" in names:
        return BadHead(400, "Content-Length and Transfer-Encoding together (a request smuggling pattern)")
    for line in lines[1:-2]:
        name, _, value = line.partition(b":")
        text = value.decode("latin-1").strip(" \t")
        if name.lower() == b"content-length" and not LENGTH.fullmatch(text):
            return BadHead(400, "Content-Length is not a length (1 to 18 ASCII digits)")
        if name.lower() == b"transfer-encoding" and text.lower() != "chunked":
            return BadHead(501, f"Transfer-Encoding {text[:40].lower()!r} is not supported (only chunked)")
    return BadHead(400, f"bad request head ({reason})")


def response_fault(raw: bytes, reason: str) -> str:
    """The first fault of a response head llhttp refused (``reason``, its
    words); a runner's answer, so its lines may be shown."""
    lines = raw.decode("latin-1").split("\r\n")
    if re.fullmatch(r"HTTP/1\.[01] [0-9]{3}( .*)?", lines[0]) is None:
        return f"not an HTTP response: {lines[0][:80]!r}"
    for line in lines[1:-2]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name.encode("latin-1")):
            return f"bad response header line {line[:80]!r}"
        value = value.strip(" \t")
        if name.lower() == "content-length" and not (value.isascii() and value.isdigit()):
            return f"bad Content-Length {value[:40]!r}"
        if name.lower() == "content-length":
            return f"answered with Content-Length {value[:40]}, over its limit (and past 2**64 - 1 bytes)"
    return f"bad response head ({reason})"


def _shown(name: bytes) -> str:
    """A header name as an error shows it: quoted, and cut short."""
    return repr(name[:60].decode("latin-1"))
