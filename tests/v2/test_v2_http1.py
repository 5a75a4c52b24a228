"""The HTTP/1.1 pieces the daemon's front, its runner client and the
runner's server share (cartonstore.v2.http1): taking a head out of what a
connection received, reading request and response heads, and the one
chunked decoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cartonstore.v2.http1 import (
    MAX_HEAD,
    BadChunks,
    BadHead,
    parse_request_head,
    parse_response_head,
    take_head,
)


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


CHUNKED = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_a_chunked_body_fed_in_any_cut_ends_where_it_ends() -> None:
    data = b"3;ext=1\r\nabc\r\n0A\r\n0123456789\r\n0\r\nX-T: t\r\n\r\nGET / HTTP/1.1\r\n"
    whole = data.index(b"GET")
    for cut in range(len(data) + 1):
        decoder = parse_request_head(CHUNKED).chunked_body()
        first = decoder.feed(data[:cut])
        taken = first if first is not None else cut + decoder.feed(bytearray(b"xx" + data[cut:]), 2)
        assert (taken, bytes(decoder.body)) == (whole, b"abc0123456789"), cut


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), max_size=6), st.lists(st.integers(0, 400), max_size=4),
       st.sampled_from([b"", b"T: v\r\n"]))
def test_any_chunked_body_cut_anywhere_decodes_whole_and_ends_where_it_ends(chunks: list[bytes], cuts: list[int],
                                                                           trailer: bytes) -> None:
    sent = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n" + trailer + b"\r\n"
    stream = sent + b"GET / HTTP/1.1\r\n"
    decoder = parse_request_head(CHUNKED).chunked_body()
    taken, at = None, 0
    for cut in [*sorted({min(c, len(stream)) for c in cuts}), len(stream)]:
        if cut < at:
            continue
        taken = decoder.feed(stream[at:cut])
        if taken is not None:
            taken += at
            break
        at = cut
    assert (taken, bytes(decoder.body)) == (len(sent), b"".join(chunks))


def test_a_chunk_of_crlf_crlf_bytes_is_data_not_the_end() -> None:
    decoder = parse_request_head(CHUNKED).chunked_body()
    assert decoder.feed(b"4\r\n\r\n\r\n\r\n") is None and not decoder.ended
    assert decoder.feed(b"0\r\n\r\n") == 5 and decoder.body == b"\r\n\r\n"


@pytest.mark.parametrize(("body", "limit", "words"), [
    (b"-5\r\n", None, "bad chunk size"), (b"0x5\r\n", None, "bad chunk size"), (b"zz\r\n", None, "bad chunk size"),
    (b"1ffffffffffffffff\r\n", None, "bad chunk size (Chunk size overflow)"),   # past 2**64 - 1
    (b"2\r\nabXY", None, "chunk not followed by CRLF"),
    (b"ffffffffffffffff\r\n" + b"a" * 11, 10, "chunks of more than 10 B in all"),   # refused as its bytes come
    (b"0\r\n" + b"X-T: t\r\n" * 101 + b"\r\n", None, "more than 100 trailer lines"),
    (b"1;" + b"e" * (MAX_HEAD + 100), None, "chunked framing"),
])
def test_a_chunked_body_that_breaks_framing_or_limits_is_refused_by_name(body: bytes, limit: int | None,
                                                                        words: str) -> None:
    decoder = parse_request_head(CHUNKED).chunked_body(limit)
    with pytest.raises(BadChunks, match=words.replace("(", r"\(").replace(")", r"\)")):
        decoder.feed(body)


def test_a_response_head_and_its_chunked_body_read_by_one_parser() -> None:
    head = parse_response_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n")
    assert (head.status, head.keep_alive, head.is_chunked, head.headers["x-a"]) == (200, True, True, "1")
    decoder = head.chunked_body(max_chunks=2)
    with pytest.raises(BadChunks, match="in more than 2 chunks"):
        decoder.feed(b"1\r\na\r\n" * 3)
    assert parse_response_head(b"HTTP/1.0 204 No Content\r\n\r\n").keep_alive is False


@pytest.mark.parametrize(("raw", "status", "words"), [
    (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
     "Content-Length and Transfer-Encoding together"),
    (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", 400, "more than one Content-Length"),
    (b"POST / HTTP/1.1\r\nContent-Length: 100000000000000000000\r\n\r\n", 400, "is not a length"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "Transfer-Encoding 'gzip' is not supported"),
    (b"GET / HTTP/2.0\r\n\r\n", 400, "bad request line"),
    (b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", 400, "folded continuation of 'X'"),
])
def test_request_heads_that_smuggle_or_are_not_http_1_are_refused_by_name(raw: bytes, status: int,
                                                                          words: str) -> None:
    with pytest.raises(BadHead, match=words) as refused:
        parse_request_head(raw)
    assert refused.value.status == status
