"""Content-Encoding decoding: real compressors in, the same bytes out.

Bodies are made with the real tools (gzip, zlib, brotli, zstandard) and fed
to ContentDecoder whole, one byte at a time and in odd-sized chunks.
Hostile bodies (truncated, trailing garbage, bombs, random bytes) must raise
FetchError naming the URL and nothing else; bombs are built in a streaming
way (1 GiB of zeros never exists in memory) and every piece yielded must be
at most 1 MiB.
"""

from __future__ import annotations

import gzip
import itertools
import os
import struct
import tracemalloc
import zlib
from collections.abc import Callable, Iterable

import brotli
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cartonstore.errors import FetchError
from cartonstore.fetch.http.content_encoding import (
    DEFAULT_ACCEPT_ENCODING,
    MAX_STACKED_CODINGS,
    PIECE_SIZE,
    ContentDecoder,
    parse_content_encoding,
)

URL = "https://user:hunter2@models.example.com/blobs/x?token=s3cret"
SHOWN = "https://models.example.com/blobs/x?..."
MiB = 1 << 20
GiB = 1 << 30
ZEROS = bytes(MiB)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Text-like and random content, so both compressible and incompressible
# streams (stored blocks, raw zstd blocks) are covered.
CONTENT = b"".join(b"line %d of a model file\n" % i for i in range(5000)) + os.urandom(70000)


def zstd_compress(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(data)


def brotli_compress(data: bytes) -> bytes:
    return brotli.compress(data, quality=11 if len(data) < 10000 else 5)


def raw_deflate(data: bytes, level: int = 6) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,  # RFC 1950 zlib-wrapped, as the RFC says
    "raw-deflate": raw_deflate,  # what some servers send as "deflate"
    "br": brotli_compress,
    "zstd": zstd_compress,
    "identity": lambda data: data,
}


def header_for(name: str) -> str:
    return "deflate" if name == "raw-deflate" else name


def decode(codings: Iterable[str], body: bytes, *, chunk: int | None = None,
           **limits: int) -> bytes:
    """Feed ``body`` in pieces of ``chunk`` bytes (whole if None) and finish."""
    codings = tuple(codings)
    decoder = ContentDecoder(codings, url=URL, **limits)
    step = chunk or max(len(body), 1)
    out = bytearray()
    for start in range(0, len(body), step):
        for piece in decoder.feed(body[start : start + step]):
            # Decoded pieces are bounded; an identity body passes through in
            # the chunks the caller read (already bounded by the caller).
            assert 0 < len(piece) <= (PIECE_SIZE if codings else step)
            out += piece
    decoder.finish()
    assert decoder.encoded_bytes == len(body)
    assert decoder.decoded_bytes == len(out)
    return bytes(out)


def refuse(codings: Iterable[str], body: bytes, *, chunk: int | None = None,
           **limits: int) -> FetchError:
    with pytest.raises(FetchError) as caught:
        decode(codings, body, chunk=chunk, **limits)
    error = caught.value
    assert SHOWN in error.message and "s3cret" not in error.message
    assert "hunter2" not in error.message
    assert error.subject == URL and not error.retryable
    return error


# --- the header --------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (None, ()),
    ("", ()),
    ("identity", ()),
    (" , ,", ()),
    ("gzip", ("gzip",)),
    ("GZIP", ("gzip",)),
    ("x-gzip", ("gzip",)),
    (" br ", ("br",)),
    ("Zstd", ("zstd",)),
    ("deflate", ("deflate",)),
    ("gzip, zstd", ("gzip", "zstd")),
    ("gzip,,identity, br", ("gzip", "br")),
    ("identity, deflate", ("deflate",)),
    ("gzip, gzip", ("gzip", "gzip")),
])
def test_parse_content_encoding(value: str | None, expected: tuple[str, ...]) -> None:
    assert parse_content_encoding(value, url=URL) == expected


@pytest.mark.parametrize("value, unknown", [
    ("compress", "compress"),
    ("x-compress", "x-compress"),
    ("gzip, lzma", "lzma"),
    ("bzip2", "bzip2"),
    ("aes128gcm", "aes128gcm"),
    ("gzip;q=1", "gzip;q=1"),
])
def test_unknown_coding_is_refused_naming_it(value: str, unknown: str) -> None:
    with pytest.raises(FetchError) as caught:
        parse_content_encoding(value, url=URL)
    assert caught.value.message == (
        f"unsupported Content-Encoding {unknown!r} from {SHOWN}; supported: zstd, br, gzip, deflate"
    )
    assert caught.value.subject == URL


def test_default_accept_encoding() -> None:
    assert DEFAULT_ACCEPT_ENCODING == "zstd, br, gzip, deflate"


@pytest.mark.parametrize("value", ["gzip, gzip, gzip", "br, zstd, gzip", ", ".join(["gzip"] * 1000)])
def test_too_many_stacked_codings_are_refused(value: str) -> None:
    with pytest.raises(FetchError, match="too many stacked Content-Encodings"):
        parse_content_encoding(value, url=URL)
    with pytest.raises(FetchError, match="too many"):
        ContentDecoder(value.split(","), url=URL)
    assert MAX_STACKED_CODINGS == 2


def test_decoder_refuses_unknown_codings_too() -> None:
    with pytest.raises(FetchError, match="'compress'"):
        ContentDecoder(["compress"], url=URL)


# --- round trips -------------------------------------------------------------

@pytest.mark.parametrize("name", COMPRESSORS)
@pytest.mark.parametrize("chunk", [None, 1, 3, 1000, 65536, 3 * MiB])
def test_round_trip(name: str, chunk: int | None) -> None:
    body = COMPRESSORS[name](CONTENT[:5000] if chunk == 1 else CONTENT)
    expected = CONTENT[:5000] if chunk == 1 else CONTENT
    codings = parse_content_encoding(header_for(name), url=URL)
    assert decode(codings, body, chunk=chunk) == expected


@pytest.mark.parametrize("name", COMPRESSORS)
@pytest.mark.parametrize("mib", [1, 2, 3, 5, 9])
def test_round_trip_of_highly_compressible_content_in_bounded_pieces(name: str, mib: int) -> None:
    # Sizes around the piece size and the decoders' buffer sizes, where
    # output held back inside a decoder is easiest to lose.
    content = ZEROS * mib + b"end"
    codings = parse_content_encoding(header_for(name), url=URL)
    assert decode(codings, COMPRESSORS[name](content)) == content


@pytest.mark.parametrize("name", COMPRESSORS)
def test_empty_content_round_trips(name: str) -> None:
    codings = parse_content_encoding(header_for(name), url=URL)
    assert decode(codings, COMPRESSORS[name](b"")) == b""


@pytest.mark.parametrize("name", COMPRESSORS)
def test_empty_body_is_empty_content(name: str) -> None:
    codings = parse_content_encoding(header_for(name), url=URL)
    assert decode(codings, b"") == b""


def test_identity_passes_chunks_through_and_counts() -> None:
    decoder = ContentDecoder((), url=URL)
    body = os.urandom(3 * MiB + 5)
    pieces = list(decoder.feed(body))
    assert [len(p) for p in pieces] == [len(body)]
    assert b"".join(pieces) == body
    decoder.finish()
    assert decoder.encoded_bytes == decoder.decoded_bytes == len(body)


@pytest.mark.parametrize("level", [1, 6, 9])
@pytest.mark.parametrize("wbits", [9, 12, 15])
def test_deflate_zlib_wrapped_and_raw_are_both_detected(level: int, wbits: int) -> None:
    wrapped = zlib.compressobj(level, zlib.DEFLATED, wbits)
    raw = zlib.compressobj(level, zlib.DEFLATED, -wbits)
    for compressor in (wrapped, raw):
        body = compressor.compress(CONTENT) + compressor.flush()
        assert decode(["deflate"], body, chunk=1 if level == 1 else None) == CONTENT


def test_multi_member_gzip_is_one_body() -> None:
    body = gzip.compress(b"first\n") + gzip.compress(b"") + gzip.compress(CONTENT)
    assert decode(["gzip"], body) == b"first\n" + CONTENT
    assert decode(["gzip"], body, chunk=1) == b"first\n" + CONTENT
    assert decode(["gzip"], body, chunk=7) == b"first\n" + CONTENT


def test_multi_frame_zstd_is_one_body() -> None:
    body = zstd_compress(b"first\n") + zstd_compress(CONTENT)
    assert decode(["zstd"], body, chunk=5) == b"first\n" + CONTENT


@pytest.mark.parametrize("header, encode", [
    ("gzip, zstd", lambda data: zstd_compress(gzip.compress(data))),
    ("zstd, gzip", lambda data: gzip.compress(zstd_compress(data))),
    ("deflate, br", lambda data: brotli_compress(raw_deflate(data))),
    ("br, deflate", lambda data: zlib.compress(brotli_compress(data))),
    ("gzip, gzip", lambda data: gzip.compress(gzip.compress(data))),
    ("identity, gzip, identity, br", lambda data: brotli_compress(gzip.compress(data))),
])
@pytest.mark.parametrize("chunk", [None, 1, 4096])
def test_stacked_codings_are_undone_in_reverse(header: str, encode: Callable[[bytes], bytes],
                                              chunk: int | None) -> None:
    content = CONTENT[:3000] if chunk == 1 else CONTENT
    codings = parse_content_encoding(header, url=URL)
    assert decode(codings, encode(content), chunk=chunk) == content


def test_stacked_in_the_wrong_order_is_corrupt() -> None:
    body = zstd_compress(gzip.compress(CONTENT))
    refuse(["zstd", "gzip"], body)  # says zstd applied first: gzip is undone first


# --- truncation and trailing garbage -----------------------------------------

TRUNCATABLE = {
    "gzip": ("gzip", gzip.compress),
    "zlib deflate": ("deflate", zlib.compress),
    "raw deflate": ("deflate", raw_deflate),
    "br": ("br", brotli_compress),
    "zstd": ("zstd", zstd_compress),
}


@pytest.mark.parametrize("name", TRUNCATABLE)
@pytest.mark.parametrize("keep", [1, 2, 10, 0.5, -4, -1])
def test_truncated_body_is_refused(name: str, keep: float) -> None:
    coding, compress = TRUNCATABLE[name]
    body = compress(CONTENT)
    cut = int(len(body) * keep) if isinstance(keep, float) else keep % len(body)
    for chunk in (None, 1000):
        error = refuse([coding], body[:cut], chunk=chunk)
        assert error.message == f"body ends inside its {coding} stream: {SHOWN}"


def test_truncated_inner_stream_of_stacked_codings_is_refused() -> None:
    inner = gzip.compress(CONTENT)[:-10]
    error = refuse(["gzip", "zstd"], zstd_compress(inner))
    assert "inside its gzip stream" in error.message


def test_truncated_second_gzip_member_is_refused() -> None:
    body = gzip.compress(b"one") + gzip.compress(b"two")
    for cut in (1, 2, 5, 15):
        error = refuse(["gzip"], body[:-cut])
        assert "inside its gzip stream" in error.message


@pytest.mark.parametrize("name, garbage", [
    ("gzip", b"garbage"),
    ("gzip", b"\x00" * 8),
    ("gzip", b"\x1f\x8c"),
    ("gzip", b"\x1f\x8b\x08\x00nonsense-header-and-data"),
    ("zlib deflate", b"x"),
    ("zlib deflate", zlib.compress(b"second stream")),
    ("raw deflate", b"\x00"),
    ("raw deflate", b"more"),
    ("br", b"junk"),
    ("br", brotli.compress(b"second")),
    ("zstd", b"junk"),
    ("zstd", b"\x28\xb5\x2f\xfd"),
])
def test_trailing_garbage_is_refused(name: str, garbage: bytes) -> None:
    coding, compress = TRUNCATABLE[name]
    body = compress(CONTENT) + garbage
    refuse([coding], body)
    refuse([coding], body, chunk=len(body) - len(garbage))  # garbage in its own chunk


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_trailing_garbage_message(coding: str) -> None:
    body = (gzip.compress if coding == "gzip" else zlib.compress)(b"x") + b"garbage"
    error = refuse([coding], body)
    assert error.message == f"body continues after the end of its {coding} stream: {SHOWN}"


@pytest.mark.parametrize("name", ["gzip", "zlib deflate", "zstd"])  # the checksummed ones
def test_corrupt_data_is_refused(name: str) -> None:
    coding, compress = TRUNCATABLE[name]
    body = bytearray(compress(CONTENT))
    for i in range(len(body) // 3, len(body) // 3 + 16):
        body[i] ^= 0x55
    refuse([coding], bytes(body))


@pytest.mark.parametrize("coding", ["gzip", "zstd", "br"])
def test_not_compressed_at_all_is_refused(coding: str) -> None:
    refuse([coding], b"<html>this is not compressed</html>")


# --- bombs -------------------------------------------------------------------

def _deflate_of_zeros(total: int) -> Iterable[bytes]:
    """Raw deflate of ``total`` zero bytes (a multiple of 1 MiB), built from
    one compressed MiB repeated: a full flush makes each piece independent."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    piece = compressor.compress(ZEROS) + compressor.flush(zlib.Z_FULL_FLUSH)
    yield piece * (total // MiB)
    yield b"\x03\x00"  # an empty final block


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """1 GiB of zeros as a valid gzip body of about 1 MiB."""
    crc = 0
    for _ in range(GiB // MiB):
        crc = zlib.crc32(ZEROS, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + b"".join(_deflate_of_zeros(GiB)) + struct.pack("<II", crc, GiB & 0xFFFFFFFF)


@pytest.fixture(scope="module")
def zstd_bomb() -> bytes:
    """1 GiB of zeros as zstd (about 32 KiB), compressed a MiB at a time."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    parts = [compressor.compress(ZEROS) for _ in range(GiB // MiB)]
    return b"".join(parts) + compressor.flush()


@pytest.fixture(scope="module")
def brotli_bomb() -> bytes:
    """1 GiB of zeros as brotli (about 190 KiB), compressed a MiB at a time."""
    compressor = brotli.Compressor(quality=1)
    parts = [compressor.process(ZEROS) for _ in range(GiB // MiB)]
    return b"".join(parts) + compressor.finish()


@pytest.fixture(params=["gzip", "zstd", "br", "deflate"])
def bomb(request: pytest.FixtureRequest) -> tuple[str, bytes]:
    if request.param == "deflate":
        return "deflate", b"".join(_deflate_of_zeros(256 * MiB))
    return request.param, request.getfixturevalue(f"{request.param.replace('br', 'brotli')}_bomb")


def _feed_all(decoder: ContentDecoder, body: bytes, chunk: int) -> int:
    """Feed everything, checking each piece's size; the decoded total."""
    total = 0
    for start in range(0, len(body), chunk):
        for piece in decoder.feed(body[start : start + chunk]):
            assert len(piece) <= PIECE_SIZE
            total += len(piece)
    decoder.finish()
    return total


def test_bombs_are_what_they_claim(gzip_bomb: bytes, zstd_bomb: bytes, brotli_bomb: bytes) -> None:
    assert len(gzip_bomb) < 1100 * 1024 and len(zstd_bomb) < 64 * 1024
    assert len(brotli_bomb) < 256 * 1024
    # The start of each decodes to zeros with the real libraries.
    assert zlib.decompressobj(31).decompress(gzip_bomb[:4096], MiB) == ZEROS
    assert zstandard.ZstdDecompressor().decompressobj().decompress(zstd_bomb[:256])[:MiB] == ZEROS


@pytest.mark.parametrize("chunk", [64 * 1024, 1 << 24])
def test_bomb_is_refused_by_max_output(bomb: tuple[str, bytes], chunk: int) -> None:
    coding, body = bomb
    decoder = ContentDecoder([coding], url=URL, max_output=10 * MiB)
    with pytest.raises(FetchError, match="decompression bomb") as caught:
        _feed_all(decoder, body, chunk)
    assert SHOWN in caught.value.message
    assert decoder.decoded_bytes <= 10 * MiB


def test_bomb_is_refused_by_the_ratio(bomb: tuple[str, bytes]) -> None:
    coding, body = bomb
    # gzip and deflate top out near 1032:1, so their bombs stay under the
    # default 1000:1 for long stretches; a lower ratio catches them.
    ratio = 100 if coding in ("gzip", "deflate") else 1000
    decoder = ContentDecoder([coding], url=URL, max_ratio=ratio, ratio_floor=8 * MiB)
    with pytest.raises(FetchError, match="ratio") as caught:
        _feed_all(decoder, body, 64 * 1024)
    assert "decompression bomb" in caught.value.message
    assert decoder.decoded_bytes <= max(8 * MiB, ratio * decoder.encoded_bytes)


@pytest.mark.parametrize("coding", ["zstd", "br"])
def test_bomb_is_refused_with_default_limits(coding: str, request: pytest.FixtureRequest) -> None:
    body = request.getfixturevalue(f"{coding.replace('br', 'brotli')}_bomb")
    decoder = ContentDecoder([coding], url=URL)
    with pytest.raises(FetchError, match="ratio"):
        _feed_all(decoder, body, len(body))
    assert decoder.decoded_bytes <= max(64 << 20, 1000 * len(body))


def test_bomb_inside_a_stacked_coding_is_refused(gzip_bomb: bytes) -> None:
    body = zstd_compress(gzip_bomb)  # "gzip, zstd"
    decoder = ContentDecoder(["gzip", "zstd"], url=URL, max_output=32 * MiB)
    with pytest.raises(FetchError, match="decompression bomb"):
        _feed_all(decoder, body, 65536)


def test_outer_coding_cannot_hide_unbounded_work() -> None:
    # zstd of a gzip body made of empty members: every stage but the last
    # produces bytes, the last produces none. The ratio still applies.
    empties = gzip.compress(b"") * (4 * MiB // 20)
    decoder = ContentDecoder(["gzip", "zstd"], url=URL, max_ratio=50, ratio_floor=MiB)
    with pytest.raises(FetchError, match="ratio"):
        _feed_all(decoder, zstd_compress(empties), 65536)
    assert decoder.decoded_bytes == 0


def test_ratio_is_not_applied_below_the_floor() -> None:
    content = bytes(4 * MiB)
    body = zstd_compress(content)
    assert len(body) * 1000 < len(content)
    assert decode(["zstd"], body, max_ratio=1000, ratio_floor=8 * MiB) == content


def test_exactly_max_output_is_allowed() -> None:
    assert decode(["gzip"], gzip.compress(CONTENT), max_output=len(CONTENT)) == CONTENT
    refuse(["gzip"], gzip.compress(CONTENT), max_output=len(CONTENT) - 1)
    error = refuse([], CONTENT, max_output=len(CONTENT) - 1)
    assert error.message == f"body from {SHOWN} is larger than {len(CONTENT) - 1} bytes"


def test_decoder_takes_a_header_value_too() -> None:
    decoder = ContentDecoder("x-gzip, identity", url=URL)
    assert b"".join(decoder.feed(gzip.compress(CONTENT))) == CONTENT
    decoder.finish()


@pytest.mark.parametrize("coding", ["gzip", "zstd", "br"])
def test_one_bomb_chunk_decodes_in_bounded_memory(coding: str, request: pytest.FixtureRequest) -> None:
    body = request.getfixturevalue(f"{coding.replace('br', 'brotli')}_bomb")
    decoder = ContentDecoder([coding], url=URL)
    tracemalloc.start()
    try:
        pieces = decoder.feed(body)  # the whole bomb in one chunk
        for _, piece in zip(range(40), pieces, strict=False):
            assert len(piece) <= PIECE_SIZE
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoder.decoded_bytes >= 20 * MiB
    assert peak < 16 * MiB


# --- fuzz --------------------------------------------------------------------

SAMPLES = {
    "gzip": gzip.compress(CONTENT[:3000]) + gzip.compress(b"tail"),
    "deflate": zlib.compress(CONTENT[:3000]),
    "br": brotli_compress(CONTENT[:3000]),
    "zstd": zstd_compress(CONTENT[:3000]),
}
CODING_LISTS = st.sampled_from([
    ("gzip",), ("deflate",), ("br",), ("zstd",), (), ("gzip", "zstd"), ("br", "deflate"),
])


def _decode_or_fetch_error(codings: tuple[str, ...], body: bytes, cuts: list[int]) -> None:
    decoder = ContentDecoder(codings, url=URL, max_output=MiB, ratio_floor=64 * 1024, max_ratio=50)
    bounds = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    try:
        for start, end in itertools.pairwise(bounds):
            for piece in decoder.feed(body[start:end]):
                assert len(piece) <= PIECE_SIZE
        decoder.finish()
    except FetchError as error:
        assert SHOWN in error.message


@FUZZ
@given(codings=CODING_LISTS, body=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=5))
def test_fuzz_random_bytes_only_raise_fetch_error(codings: tuple[str, ...], body: bytes,
                                                  cuts: list[int]) -> None:
    _decode_or_fetch_error(codings, body, cuts)


@FUZZ
@given(coding=st.sampled_from(sorted(SAMPLES)), data=st.data())
def test_fuzz_mutated_streams_only_raise_fetch_error(coding: str, data: st.DataObject) -> None:
    body = bytearray(SAMPLES[coding])
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(body) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        if action == "flip":
            body[i] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "cut":
            del body[i:]
        elif action == "insert":
            body[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del body[i : i + data.draw(st.integers(1, 8))]
        if not body:
            break
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=4))
    _decode_or_fetch_error((coding,), bytes(body), cuts)
