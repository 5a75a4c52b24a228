"""The HTTP/1.1 pieces the daemon's front, its runner client and the
runner's server share (cartonstore.v2.http1): taking a head out of what a
connection received, and reading a chunk's size line."""

from __future__ import annotations

import pytest

from cartonstore.v2.http1 import MAX_HEAD, BadHead, chunk_size, take_head


def test_take_head_waits_for_the_blank_line_and_leaves_what_follows() -> None:
    pending = bytearray(b"\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n")
    assert take_head(pending) is None
    assert pending == b"GET / HTTP/1.1\r\nHost: x\r\n"   # the empty lines before a request are dropped
    pending += b"\r\nBODY"
    assert take_head(pending) == b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    assert pending == b"BODY"


def test_take_head_refuses_a_head_past_the_limit() -> None:
    pending = bytearray(b"GET / HTTP/1.1\r\nX: " + b"a" * MAX_HEAD)
    with pytest.raises(BadHead, match="request head longer than") as caught:
        take_head(pending)
    assert caught.value.status == 431


@pytest.mark.parametrize(("line", "size"), [(b"0\r\n", 0), (b"1a", 26), (b"FF;name=value\r\n", 255),
                                            (b" 10 \r\n", 16), (b"ffffffffffffffff", 2**64 - 1)])
def test_chunk_size_reads_hex_and_ignores_extensions(line: bytes, size: int) -> None:
    assert chunk_size(line) == size


@pytest.mark.parametrize("line", [b"-5", b"0x5", b"5_0", b"", b"zz", b"+1", b"1" * 17])
def test_chunk_size_refuses_anything_but_hex_digits(line: bytes) -> None:
    with pytest.raises(ValueError, match="bad chunk size"):
        chunk_size(line)
