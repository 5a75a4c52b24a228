"""The test origin (tests/kit/origin.py) does on the wire what it promises.

Sync tests talk to it with raw sockets, http.client and urllib; a few use a
real aiohttp client inside asyncio.run() to pin down which exceptions the
fetcher will see for each fault.
"""

from __future__ import annotations

import asyncio
import email.utils
import gzip
import hashlib
import http.client
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

import aiohttp
import brotli
import pytest
import zstandard
from kit.origin import ENCODINGS, Fault, Origin, _crc32_zeros, encode, gzip_bomb_bytes

DATA = bytes((i * 7 + i // 251) & 0xFF for i in range(300_000))  # not periodic in 256


@pytest.fixture
def origin() -> Iterator[Origin]:
    with Origin() as o:
        yield o


# ---------------------------------------------------------------- helpers


def fetch(origin, path, method="GET", headers=None, timeout=5) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case keys, body) via http.client."""
    conn = http.client.HTTPConnection("127.0.0.1", origin.port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        body = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, body
    finally:
        conn.close()


def raw_get(origin, path, headers="", timeout=5) -> tuple[str, bytes, OSError | None]:
    """Raw socket GET: (head text, body bytes, error raised by recv or None).
    Reads until EOF/error, so it sees exactly what was put on the wire."""
    s = socket.create_connection(("127.0.0.1", origin.port), timeout=timeout)
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{headers}\r\n".encode())
        buf, err = b"", None
        try:
            while True:
                d = s.recv(1 << 16)
                if not d:
                    break
                buf += d
        except OSError as e:
            err = e
    finally:
        s.close()
    head, _, body = buf.partition(b"\r\n\r\n")
    return head.decode("latin-1"), body, err


def aio_get(url, *, timeout=None, **kw) -> tuple[Any, ...]:
    """GET with a real aiohttp client: ("ok", status, headers, body) or
    ("exc", exception)."""

    async def go() -> tuple[Any, ...]:
        t = aiohttp.ClientTimeout(**(timeout or {"total": 10}))
        async with aiohttp.ClientSession(timeout=t) as s:
            try:
                async with s.get(url, **kw) as r:
                    return "ok", r.status, r.headers.copy(), await r.read()
            except Exception as e:  # noqa: BLE001 - the point is which one
                return "exc", e

    return asyncio.run(go())


# ---------------------------------------------------------------- basics


def test_lifecycle_url_and_clean_stop() -> None:
    o = Origin()
    o.put("/x", b"abc")  # allowed before start
    with o:
        assert o.base_url == f"http://127.0.0.1:{o.port}"
        assert o.url("/a/b") == o.base_url + "/a/b"
        assert o.url("a/b") == o.base_url + "/a/b"
        assert o.put("/y", b"z") == o.url("/y")
        threads = [t for t in threading.enumerate() if t.name == "test-origin"]
        assert len(threads) == 1 and threads[0].daemon
        assert urllib.request.urlopen(o.url("/x"), timeout=5).read() == b"abc"
        port = o.port
    assert not threads[0].is_alive()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    with pytest.raises(RuntimeError):
        o.start()


def test_get_head_headers_and_404(origin) -> None:
    origin.put("/blob", DATA)
    status, h, body = fetch(origin, "/blob")
    assert status == 200 and body == DATA
    assert h["content-length"] == str(len(DATA))
    assert h["accept-ranges"] == "bytes"
    assert h["content-type"] == "application/octet-stream"
    assert "content-encoding" not in h
    assert h["etag"] == f'"{hashlib.sha256(DATA).hexdigest()[:32]}"'
    assert abs(email.utils.parsedate_to_datetime(h["last-modified"]).timestamp() - time.time()) < 5

    status, hh, body = fetch(origin, "/blob", "HEAD")
    assert status == 200 and body == b""
    assert hh["content-length"] == str(len(DATA)) and hh["etag"] == h["etag"]

    assert fetch(origin, "/nope")[0] == 404
    origin.remove("/blob")
    assert fetch(origin, "/blob")[0] == 404
    assert origin.bytes_sent == len(DATA)


@pytest.mark.parametrize(
    "spec, expect",
    [
        ("bytes=0-0", (0, 0)),
        ("bytes=10-19", (10, 19)),
        ("bytes=299990-", (299990, 299999)),
        ("bytes=-5", (299995, 299999)),
        ("bytes=-999999", (0, 299999)),
        ("bytes=100-999999", (100, 299999)),
        ("bytes=0-299999", (0, 299999)),
        ("bytes=300000-", 416),
        ("bytes=300000-300005", 416),
        ("bytes=-0", 416),
        ("bytes=5-2", 200),  # invalid: ignored
        ("bytes=0-1,5-6", 200),  # multi-range: ignored
        ("items=0-1", 200),
        ("bytes=abc", 200),
    ],
)
def test_range_math(origin, spec, expect) -> None:
    origin.put("/r", DATA)
    status, h, body = fetch(origin, "/r", headers={"Range": spec})
    if expect == 416:
        assert status == 416 and h["content-range"] == f"bytes */{len(DATA)}" and body == b""
    elif expect == 200:
        assert status == 200 and body == DATA and "content-range" not in h
    else:
        a, b = expect
        assert status == 206
        assert h["content-range"] == f"bytes {a}-{b}/{len(DATA)}"
        assert h["content-length"] == str(b - a + 1)
        assert body == DATA[a:b + 1]
    assert origin.requests[-1].range == spec


def test_range_on_empty_body_is_416(origin) -> None:
    origin.put("/e", b"")
    assert fetch(origin, "/e")[0:3:2] == (200, b"")
    status, h, _ = fetch(origin, "/e", headers={"Range": "bytes=0-"})
    assert status == 416 and h["content-range"] == "bytes */0"


def test_if_range(origin) -> None:
    origin.put("/r", DATA)
    _, h, _ = fetch(origin, "/r", "HEAD")
    rng = {"Range": "bytes=5-9"}
    assert fetch(origin, "/r", headers={**rng, "If-Range": h["etag"]})[0] == 206
    assert fetch(origin, "/r", headers={**rng, "If-Range": h["last-modified"]})[0] == 206
    status, _, body = fetch(origin, "/r", headers={**rng, "If-Range": '"stale"'})
    assert status == 200 and body == DATA


def test_requests_counts_and_bytes(origin) -> None:
    origin.put("/a", DATA)
    origin.put("b", b"12345")  # leading slash added
    fetch(origin, "/a?x=1", headers={"X-Test": "yes", "Range": "bytes=0-99"})
    fetch(origin, "/a", "HEAD")
    fetch(origin, "/b")
    fetch(origin, "/b")
    fetch(origin, "/missing")
    reqs = origin.requests
    assert [(r.method, r.path) for r in reqs] == [
        ("GET", "/a"), ("HEAD", "/a"), ("GET", "/b"), ("GET", "/b"), ("GET", "/missing")]
    assert reqs[0].headers["x-test"] == "yes" and reqs[0].headers["X-TEST"] == "yes"
    assert "x-test" in reqs[0].headers and isinstance(reqs[0].headers, dict)
    assert reqs[0].range == "bytes=0-99" and reqs[1].range is None
    assert reqs[0].query == "x=1"
    assert reqs[0].time <= reqs[-1].time <= time.monotonic()
    assert origin.count("/a") == 1 and origin.count("/a", "HEAD") == 1
    assert origin.count("/a", method=None) == 2 and origin.count("/b") == 2
    assert origin.bytes_sent_for("/a") == 100 and origin.bytes_sent_for("/b") == 10
    assert origin.bytes_sent == 110
    origin.reset_counts()
    assert origin.requests == [] and origin.bytes_sent == 0 and origin.count("/a") == 0


def test_put_file_streams_from_disk(origin, tmp_path) -> None:
    f = tmp_path / "big.bin"
    f.write_bytes(DATA * 10)  # 3 MB: several 256 KiB chunks
    origin.put_file("/f", f)
    status, h, body = fetch(origin, "/f")
    assert status == 200 and body == DATA * 10
    assert h["etag"] == f'"{hashlib.sha256(DATA * 10).hexdigest()[:32]}"'
    status, h, body = fetch(origin, "/f", headers={"Range": "bytes=1000000-1000009"})
    assert status == 206 and body == (DATA * 10)[1000000:1000010]
    assert origin.bytes_sent_for("/f") == 3_000_010


def test_put_file_huge_sparse_range(origin, tmp_path) -> None:
    f = tmp_path / "sparse.bin"
    with open(f, "wb") as fh:
        fh.truncate(5 << 30)  # 5 GiB, no disk, never read whole
        fh.seek((5 << 30) - 4)
        fh.write(b"TAIL")
    origin.put_file("/huge", f, etag="huge")
    status, h, body = fetch(origin, "/huge", headers={"Range": "bytes=-4"})
    assert status == 206 and body == b"TAIL"
    assert h["content-range"] == f"bytes {(5 << 30) - 4}-{(5 << 30) - 1}/{5 << 30}"
    assert h["etag"] == '"huge"'
    assert fetch(origin, "/huge", "HEAD")[1]["content-length"] == str(5 << 30)


def test_cli_subprocess_is_served(origin) -> None:
    origin.put("/cli", DATA)
    code = "import sys,urllib.request;sys.stdout.write(str(len(urllib.request.urlopen(sys.argv[1]).read())))"
    out = subprocess.run([sys.executable, "-c", code, origin.url("/cli")],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    assert out == str(len(DATA))


def test_concurrent_aiohttp_requests(origin) -> None:
    for i in range(8):
        origin.put(f"/c{i}", DATA[i:])

    async def go() -> list[bytes]:
        async with aiohttp.ClientSession() as s:
            async def one(i) -> bytes:
                async with s.get(origin.url(f"/c{i}")) as r:
                    return await r.read()
            return await asyncio.gather(*(one(i) for i in range(8)))

    assert asyncio.run(go()) == [DATA[i:] for i in range(8)]


# ---------------------------------------------------------------- faults


def test_status_sequence_then_normal_with_retry_after(origin) -> None:
    origin.put("/s", DATA, fault=Fault(status_sequence=[500, 503], retry_after="7"))
    for expected in (500, 503):
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(origin.url("/s"), timeout=5)
        assert ei.value.code == expected
        assert ei.value.headers["Retry-After"] == "7"
        assert ei.value.read() == f"injected {expected}\n".encode()
    assert urllib.request.urlopen(origin.url("/s"), timeout=5).read() == DATA
    assert origin.count("/s") == 3
    # set_fault resets the counters
    origin.set_fault("/s", Fault(status_sequence=[429]))
    assert fetch(origin, "/s")[0] == 429 and fetch(origin, "/s")[0] == 200


def test_times_counts_after_status_sequence(origin) -> None:
    origin.put("/t", DATA, fault=Fault(status_sequence=[503], truncate_at=10, times=1))
    assert fetch(origin, "/t")[0] == 503
    with pytest.raises(http.client.IncompleteRead) as ei:
        fetch(origin, "/t")
    assert len(ei.value.partial) == 10
    assert fetch(origin, "/t")[2] == DATA
    assert fetch(origin, "/t")[2] == DATA


def test_methods_filter(origin) -> None:
    origin.put("/m", DATA, fault=Fault(status_sequence=[503], methods=("GET",)))
    assert fetch(origin, "/m", "HEAD")[0] == 200  # does not consume the 503
    assert fetch(origin, "/m")[0] == 503
    assert fetch(origin, "/m")[0] == 200


def test_set_fault_none_clears_and_unknown_path(origin) -> None:
    origin.put("/c", DATA, fault=Fault(status_sequence=[500] * 5))
    assert fetch(origin, "/c")[0] == 500
    origin.set_fault("/c", None)
    assert fetch(origin, "/c")[0] == 200
    with pytest.raises(KeyError):
        origin.set_fault("/unknown", Fault())


def test_wrong_bytes(origin) -> None:
    origin.put("/w", DATA, fault=Fault(wrong_bytes=True, times=1))
    status, h, body = fetch(origin, "/w")
    assert status == 200 and len(body) == len(DATA) == int(h["content-length"])
    assert all(x != y for x, y in zip(body, DATA, strict=True))
    status, _, body = fetch(origin, "/w", headers={"Range": "bytes=10-19"})
    assert status == 206 and body == DATA[10:20]  # times=1 used up


def test_truncate_raw_and_aiohttp(origin) -> None:
    origin.put("/t", DATA, fault=Fault(truncate_at=1000))
    head, body, err = raw_get(origin, "/t")
    assert f"Content-Length: {len(DATA)}" in head and len(body) == 1000 and err is None
    assert body == DATA[:1000]
    res = aio_get(origin.url("/t"))
    assert res[0] == "exc" and isinstance(res[1], aiohttp.ClientPayloadError)
    assert "received 1000 of 300000" in str(res[1])
    assert origin.bytes_sent_for("/t") == 2000


def test_truncate_at_zero_and_first_time_only(origin) -> None:
    origin.put("/t", DATA, fault=Fault(truncate_at=0, times=1))
    with pytest.raises(http.client.IncompleteRead) as ei:
        fetch(origin, "/t")
    assert ei.value.partial == b""
    assert fetch(origin, "/t")[2] == DATA


def test_extra_bytes(origin) -> None:
    origin.put("/x", DATA, fault=Fault(extra_bytes=b"TRAILING-GARBAGE", times=3))
    # the connection is closed after the garbage, and announced as such
    _, h, body = fetch(origin, "/x")  # http.client reads Content-Length bytes only
    assert h["connection"] == "close" and body == DATA
    head, body, err = raw_get(origin, "/x")
    assert err is None and f"Content-Length: {len(DATA)}" in head
    assert body == DATA + b"TRAILING-GARBAGE"
    assert origin.bytes_sent_for("/x") == 2 * (len(DATA) + 16)
    # aiohttp reads exactly Content-Length and reports no error
    res = aio_get(origin.url("/x"))
    assert res[0] == "ok" and res[3] == DATA
    # times=2 used up: a normal, keep-alive response again
    _, h, body = fetch(origin, "/x")
    assert body == DATA and "connection" not in h


def test_reset(origin) -> None:
    origin.put("/r", DATA, fault=Fault(reset_at=200_000))
    head, body, err = raw_get(origin, "/r")
    assert isinstance(err, ConnectionResetError)
    assert body == DATA[:200_000]
    res = aio_get(origin.url("/r"))
    assert res[0] == "exc" and isinstance(res[1], aiohttp.ClientPayloadError)
    assert "ConnectionResetError" in str(res[1])
    origin.set_fault("/r", Fault(reset_at=0, times=1))
    head, body, err = raw_get(origin, "/r")
    assert head.startswith("HTTP/1.1 200") and body == b"" and isinstance(err, ConnectionResetError)
    assert raw_get(origin, "/r")[1] == DATA


def test_stall_then_continue(origin) -> None:
    origin.put("/s", DATA, fault=Fault(stall_at=100, stall_seconds=0.5))
    s = socket.create_connection(("127.0.0.1", origin.port), timeout=5)
    try:
        s.sendall(b"GET /s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        t0 = time.monotonic()
        buf = b""
        while not buf.endswith(DATA[:100]):
            buf += s.recv(1 << 16)
        got_first = time.monotonic() - t0
        s.settimeout(0.25)
        with pytest.raises(socket.timeout):  # nothing during the stall
            s.recv(1)
        s.settimeout(5)
        while True:
            d = s.recv(1 << 16)
            if not d:
                break
            buf += d
        total = time.monotonic() - t0
    finally:
        s.close()
    assert got_first < 0.45 and 0.5 <= total < 2.5
    assert buf.endswith(DATA)


def test_stall_aiohttp_read_timeout(origin) -> None:
    origin.put("/s", DATA, fault=Fault(stall_at=10))  # forever
    res = aio_get(origin.url("/s"), timeout={"sock_read": 0.2})
    assert res[0] == "exc" and isinstance(res[1], aiohttp.SocketTimeoutError)
    assert isinstance(res[1], aiohttp.ServerTimeoutError) and isinstance(res[1], TimeoutError)
    res = aio_get(origin.url("/s"), timeout={"total": 0.2})
    assert res[0] == "exc" and type(res[1]) is TimeoutError  # bare asyncio timeout


def test_stop_with_a_stalled_connection_is_prompt() -> None:
    o = Origin().start()
    o.put("/s", DATA, fault=Fault(stall_at=0))
    s = socket.create_connection(("127.0.0.1", o.port), timeout=5)
    try:
        s.sendall(b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n")
        assert s.recv(1000).startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        o.stop()
        assert time.monotonic() - t0 < 1.0
        try:
            assert s.recv(1000) == b""
        except ConnectionResetError:
            pass
    finally:
        s.close()


def test_delay(origin) -> None:
    origin.put("/d", b"x", fault=Fault(delay=0.4, times=1))
    t0 = time.monotonic()
    assert fetch(origin, "/d")[2] == b"x"
    assert time.monotonic() - t0 >= 0.4
    t0 = time.monotonic()
    assert fetch(origin, "/d")[2] == b"x"
    assert time.monotonic() - t0 < 0.3
    origin.set_fault("/d", Fault(delay=2))
    res = aio_get(origin.url("/d"), timeout={"sock_read": 0.2})
    assert res[0] == "exc" and isinstance(res[1], aiohttp.SocketTimeoutError)


def test_ignore_range_and_no_accept_ranges(origin) -> None:
    origin.put("/i", DATA, fault=Fault(ignore_range=True))
    status, h, body = fetch(origin, "/i", headers={"Range": "bytes=5-9"})
    assert status == 200 and body == DATA and h["accept-ranges"] == "bytes"
    assert "content-range" not in h
    origin.set_fault("/i", Fault(no_accept_ranges=True))
    status, h, body = fetch(origin, "/i", headers={"Range": "bytes=5-9"})
    assert status == 200 and body == DATA and "accept-ranges" not in h


def test_wrong_content_range(origin) -> None:
    origin.put("/w", DATA, fault=Fault(wrong_content_range=True))
    n = len(DATA)
    for asked, (a, b) in [("bytes=10-19", (11, 20)), ("bytes=-10", (n - 11, n - 2)),
                          (f"bytes=0-{n - 1}", (1, n - 1))]:
        status, h, body = fetch(origin, "/w", headers={"Range": asked})
        assert status == 206
        assert h["content-range"] == f"bytes {a}-{b}/{n}"
        assert body == DATA[a:b + 1] and h["content-length"] == str(b - a + 1)
    assert fetch(origin, "/w")[0:3:2] == (200, DATA)


DECODE = {
    "gzip": gzip.decompress,
    "deflate": zlib.decompress,
    "deflate-raw": lambda b: zlib.decompress(b, -15),
    "br": brotli.decompress,
    "zstd": lambda b: zstandard.ZstdDecompressor().decompressobj().decompress(b),
}


@pytest.mark.parametrize("enc", ["gzip", "deflate", "deflate-raw", "br", "zstd"])
def test_encodings_on_the_wire(origin, enc) -> None:
    origin.put("/e", DATA, fault=Fault(encoding=enc))
    status, h, body = fetch(origin, "/e")
    assert status == 200
    assert h["content-encoding"] == ("deflate" if enc == "deflate-raw" else enc)
    assert int(h["content-length"]) == len(body) < len(DATA)
    assert DECODE[enc](body) == DATA
    assert body == encode(DATA, enc)
    # ranges address the encoded representation
    status, h, part = fetch(origin, "/e", headers={"Range": "bytes=3-12"})
    assert status == 206 and part == body[3:13]
    assert h["content-range"] == f"bytes 3-12/{len(body)}"


def test_aiohttp_view_of_encodings(origin) -> None:
    origin.put("/e", DATA)
    for enc in ("gzip", "deflate", "deflate-raw", "br"):  # decoded transparently
        origin.set_fault("/e", Fault(encoding=enc))
        res = aio_get(origin.url("/e"))
        assert res[0] == "ok" and res[3] == DATA, enc
    # without backports.zstd, aiohttp refuses zstd when the response starts
    origin.set_fault("/e", Fault(encoding="zstd"))
    res = aio_get(origin.url("/e"))
    if res[0] == "exc":
        assert isinstance(res[1], aiohttp.ClientResponseError) and res[1].status == 400
        assert "zstd" in str(res[1])
    else:
        assert res[3] == DATA
    # auto_decompress=False hands over the raw encoded bytes

    async def raw() -> tuple[str, bytes]:
        async with aiohttp.ClientSession(auto_decompress=False) as s, s.get(origin.url("/e")) as r:
            return r.headers["Content-Encoding"], await r.read()

    coding, body = asyncio.run(raw())
    assert coding == "zstd" and DECODE["zstd"](body) == DATA


def test_put_encoding_is_permanent_and_fault_overrides(origin) -> None:
    origin.put("/p", DATA, encoding="br")
    for _ in range(2):
        _, h, body = fetch(origin, "/p")
        assert h["content-encoding"] == "br" and brotli.decompress(body) == DATA
    origin.set_fault("/p", Fault(encoding="gzip", times=1))
    assert gzip.decompress(fetch(origin, "/p")[2]) == DATA
    assert fetch(origin, "/p")[1]["content-encoding"] == "br"
    # truncation applies to the encoded bytes
    origin.set_fault("/p", Fault(truncate_at=5, times=1))
    res = aio_get(origin.url("/p"))
    assert res[0] == "exc" and isinstance(res[1], aiohttp.ClientPayloadError)


def test_double_encoding(origin) -> None:
    origin.put("/d", DATA, fault=Fault(double_encoding=("gzip", "zstd")))
    status, h, body = fetch(origin, "/d")
    assert status == 200 and h["content-encoding"] == "gzip, zstd"
    assert int(h["content-length"]) == len(body)
    assert gzip.decompress(DECODE["zstd"](body)) == DATA
    # aiohttp does not decode a list of codings: it hands over the raw bytes
    res = aio_get(origin.url("/d"))
    assert res[0] == "ok" and res[3] == body
    origin.set_fault("/d", Fault(double_encoding=("br", "gzip")))
    _, h, body = fetch(origin, "/d")
    assert h["content-encoding"] == "br, gzip"
    assert brotli.decompress(gzip.decompress(body)) == DATA


def test_claimed_encoding(origin) -> None:
    origin.put("/c", DATA, fault=Fault(claimed_encoding="bogus"))
    _, h, body = fetch(origin, "/c")
    assert h["content-encoding"] == "bogus" and body == DATA
    res = aio_get(origin.url("/c"))  # unknown coding: passed through undecoded
    assert res[0] == "ok" and res[3] == DATA
    origin.set_fault("/c", Fault(claimed_encoding="gzip"))  # a lie aiohttp trips on
    res = aio_get(origin.url("/c"))
    assert res[0] == "exc" and isinstance(res[1], aiohttp.ClientPayloadError)
    assert "content-encoding: gzip" in str(res[1])


@pytest.mark.parametrize("n", [0, 1, 1000, 1 << 20, (1 << 20) * 3 + 12345])
def test_gzip_bomb_bytes_are_exact(n) -> None:
    assert gzip.decompress(gzip_bomb_bytes(n)) == bytes(n)
    assert _crc32_zeros(n) == zlib.crc32(bytes(n))


def test_gzip_bomb_over_the_wire(origin) -> None:
    t0 = time.monotonic()
    big = gzip_bomb_bytes(10 << 30)  # 10 GiB of zeros
    assert time.monotonic() - t0 < 2 and len(big) < 11 << 20
    assert big is gzip_bomb_bytes(10 << 30)  # cached
    origin.put("/b", b"ignored", fault=Fault(gzip_bomb=10 << 30))
    status, h, _ = fetch(origin, "/b", "HEAD")
    assert h["content-encoding"] == "gzip" and h["content-length"] == str(len(big))
    status, h, part = fetch(origin, "/b", headers={"Range": "bytes=0-9"})
    assert status == 206 and part == big[:10]

    # a 64 MiB bomb, streamed by aiohttp (which inflates it) end to end
    origin.set_fault("/b", Fault(gzip_bomb=64 << 20))

    async def go() -> int:
        total = 0
        async with aiohttp.ClientSession() as s, s.get(origin.url("/b")) as r:
            async for chunk in r.content.iter_chunked(1 << 20):
                assert not chunk.strip(b"\0")
                total += len(chunk)
        return total

    assert asyncio.run(go()) == 64 << 20
    # and the raw stream passes the gzip CRC/length check
    d = zlib.decompressobj(31)
    body = fetch(origin, "/b")[2]
    out = 0
    for i in range(0, len(body), 1 << 16):
        out += len(d.decompress(body[i:i + (1 << 16)]))
    out += len(d.flush())
    assert d.eof and out == 64 << 20


def test_redirects(origin) -> None:
    origin.put("/final", DATA)
    origin.put("/abs", b"", fault=Fault(redirect_to=origin.url("/final")))
    origin.put("/rel", b"", fault=Fault(redirect_to="/final", redirect_status=307))
    status, h, _ = fetch(origin, "/abs")
    assert status == 302 and h["location"] == origin.url("/final")
    status, h, _ = fetch(origin, "/rel")
    assert status == 307 and h["location"] == "/final"
    assert urllib.request.urlopen(origin.url("/rel"), timeout=5).read() == DATA
    res = aio_get(origin.url("/abs"))
    assert res[0] == "ok" and res[3] == DATA


def test_redirect_loops(origin) -> None:
    origin.put("/loop", b"", fault=Fault(redirect_loop=True))
    status, h, _ = fetch(origin, "/loop")
    assert status == 302 and h["location"] == "/loop"
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(origin.url("/loop"), timeout=5)
    origin.reset_counts()
    res = aio_get(origin.url("/loop"))
    assert res[0] == "exc" and isinstance(res[1], aiohttp.TooManyRedirects)
    assert origin.count("/loop") == 10  # aiohttp's default max_redirects=10
    origin.put("/a", b"", fault=Fault(redirect_to="/b"))
    origin.put("/b", b"", fault=Fault(redirect_to="/a"))
    res = aio_get(origin.url("/a"))
    assert res[0] == "exc" and isinstance(res[1], aiohttp.TooManyRedirects)


def test_fault_validation() -> None:
    with pytest.raises(ValueError):
        Fault(encoding="lzma")
    with pytest.raises(ValueError):
        Fault(encoding="gzip", gzip_bomb=10)
    with pytest.raises(ValueError):
        Fault(double_encoding=("gzip",))
    with pytest.raises(ValueError):
        Fault(redirect_to="/x", redirect_loop=True)
    with pytest.raises(ValueError):
        Fault(truncate_at=-1)
    assert Fault(status_sequence=[500, 503]).status_sequence == (500, 503)
    assert set(ENCODINGS) >= {"gzip", "deflate", "deflate-raw", "br", "zstd"}
