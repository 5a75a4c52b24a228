"""A real, misbehaving-on-demand HTTP origin for tests: ``Origin``.

``Origin`` is an aiohttp web server bound to 127.0.0.1 on a random free
port.  It runs its own asyncio event loop in a daemon thread, so the same
instance serves async tests (any event loop), sync tests and CLI
subprocesses started by sync tests.  Nothing is mocked: every behaviour
below happens on the wire.

Quick use::

    with Origin() as origin:
        url = origin.put("/blobs/a", b"hello")            # GET and HEAD
        origin.put_file("/big", "/tmp/big.bin")           # streamed from disk
        origin.set_fault("/blobs/a", Fault(status_sequence=[503], retry_after="0"))
        ...
        assert origin.count("/blobs/a") == 2
        assert origin.bytes_sent_for("/blobs/a") == 5

Normal behaviour of a stored path (no fault active)
---------------------------------------------------
* ``200`` with the whole body, ``Content-Length``, ``Content-Type:
  application/octet-stream``, ``Accept-Ranges: bytes``, ``ETag`` (a quoted
  prefix of the body's sha256, with ``-<coding>`` appended for an encoded
  representation) and ``Last-Modified``.
* ``Range`` with ONE byte range -- ``bytes=a-b``, ``bytes=a-``, ``bytes=-n``
  -- gives ``206`` with ``Content-Range: bytes a-b/size`` and the matching
  ``Content-Length``; ``b`` past the end is clipped, ``-n`` larger than the
  body means the whole body.  A range starting at or past the end, ``-0``,
  or any range of an empty body gives ``416`` with ``Content-Range:
  bytes */size``.  A malformed Range, a unit other than ``bytes`` or a
  multi-range request is ignored (``200`` with the whole body), as RFC 9110
  allows.
* ``If-Range``: the Range is honoured only if the value equals the current
  ETag or the Last-Modified string exactly; otherwise ``200`` full body.
* ``HEAD`` answers the same status and headers with no body.
* Unknown paths answer ``404``.
* Content-Encoding is sent only when asked: ``put(..., encoding=...)`` (for
  every response) or ``Fault(encoding=...)`` (while the fault is active).
  The encoded representation is produced with the real compressor once, at
  ``put``/``set_fault`` time (in the caller's thread), cached, and served
  with ``Content-Length`` = ENCODED length.  Ranges, ETag and every fault
  apply to the encoded bytes, as in HTTP.  ``Accept-Encoding`` is not
  consulted: the origin sends what it was told to send.
* Bodies are streamed in ``chunk_size`` pieces (256 KiB) through
  ``web.StreamResponse``; ``put_file`` bodies are read from disk per chunk,
  so multi-GiB bodies never sit in memory (their encoded representation,
  if any, is written to a temporary file).

Faults: see :class:`Fault`.  A fault is set by ``put(..., fault=)`` or
``set_fault(path, fault)``, either of which resets its counters.

Requests are recorded as they arrive (before any delay), including 404s.
``bytes_sent`` counts body bytes as they are handed to the socket.

What an aiohttp (3.14) client sees -- pinned by tests/fetch/test_origin.py
--------------------------------------------------------------------
* status_sequence: an ordinary response with that status (no exception
  unless ``raise_for_status``); ``Retry-After`` in ``resp.headers``.
* truncate_at: ``aiohttp.ClientPayloadError`` from ``read()``/iteration
  ("Response payload is not completed: <ContentLengthError ... received N
  of M bytes>").
* reset_at: ``aiohttp.ClientPayloadError`` too, its message also naming
  ``ConnectionResetError`` (a raw socket gets ``ConnectionResetError``
  after exactly N bytes).  ``reset_at=0`` is the same (headers arrived).
* extra_bytes: nothing -- aiohttp reads exactly Content-Length bytes and
  returns them; the garbage is dropped with the closed connection.
* stall/delay with ``ClientTimeout(sock_read=...)``:
  ``aiohttp.SocketTimeoutError`` (a ``ServerTimeoutError`` and a
  ``TimeoutError``); with only ``total=``: a bare ``TimeoutError``.
* encoding gzip/deflate/deflate-raw/br: decoded transparently.  zstd:
  without ``backports.zstd`` (Python < 3.14) aiohttp raises
  ``ClientResponseError(status=400, "Can not decode content-encoding:
  zstandard (zstd)...")`` when the response starts; with
  ``auto_decompress=False`` the raw bytes come through.
* double_encoding ("gzip, zstd") and unknown claimed codings ("bogus",
  "compress"): not decoded, raw bytes returned, no error.
* claimed_encoding="gzip" over non-gzip bytes, or wrong_bytes on an
  encoded body: ``aiohttp.ClientPayloadError`` ("Can not decode
  content-encoding: gzip").
* gzip_bomb: inflated transparently (64 MiB tested, no cap seen) -- the client must
  cap decoded size itself.
* redirect_loop: ``aiohttp.TooManyRedirects`` after 10 requests.
* ignore_range/no_accept_ranges/wrong_content_range/wrong_bytes: no error;
  check ``resp.status`` / ``Content-Range`` / the hash yourself.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import os
import shutil
import socket
import ssl
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import brotli
import zstandard
from aiohttp import web

__all__ = ["ENCODINGS", "Fault", "Origin", "Request", "encode", "gzip_bomb_bytes"]

CHUNK_SIZE = 256 * 1024
#: Encodings the origin can produce.  "deflate" is the zlib format (RFC
#: 1950); "deflate-raw" is a raw RFC 1951 stream that is nevertheless
#: labelled ``Content-Encoding: deflate`` (what some real servers send).
ENCODINGS = ("gzip", "deflate", "deflate-raw", "br", "zstd", "identity")
_IN_MEMORY_LIMIT = 64 * 1024 * 1024  # encode to a temp file above this source size
_INVERT = bytes(b ^ 0xFF for b in range(256))


# --------------------------------------------------------------------------
# Public records


class HeaderDict(dict):
    """A plain ``dict`` of request headers with case-insensitive lookup
    (keys are stored lower-cased)."""

    def __init__(self, items=()) -> None:
        super().__init__()
        for k, v in items:
            k = k.lower()
            super().__setitem__(k, v if k not in self else f"{self[k]}, {v}")

    def __getitem__(self, key) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())

    def get(self, key, default=None) -> Any:
        return super().get(key.lower(), default)


@dataclass(frozen=True)
class Request:
    """One request as the origin saw it.  ``time`` is ``time.monotonic()``
    at arrival; ``range`` is the raw Range header (or None); ``headers`` is
    a dict with case-insensitive lookup; ``query`` is the raw query string."""

    method: str
    path: str
    headers: dict
    range: str | None
    time: float
    query: str = ""


@dataclass(frozen=True)
class Fault:
    """How a path misbehaves.  Options combine where sensible.

    Which requests are affected
    ---------------------------
    Only requests whose method is in ``methods`` (default GET and HEAD) see
    the fault or advance its counters; others are served normally.  Such a
    request first consumes the next entry of ``status_sequence`` (if any is
    left); once that is exhausted, each request consumes one of ``times``
    (``None`` = every request, forever) and gets all the other options
    below; after ``times`` such responses the path behaves normally again.
    So ``Fault(status_sequence=[503], truncate_at=10, times=1)`` gives: 503,
    then one truncated 200, then normal 200s.  Counters reset on
    ``set_fault``/``put``.

    Options
    -------
    status_sequence
        Answer these statuses, one per request, with a tiny body
        (``b"injected <status>\\n"``), before anything else; e.g. ``[500,
        503]`` then normal 200s.
    retry_after
        ``Retry-After`` header value added to the ``status_sequence``
        answers.
    delay
        Seconds to wait before sending the response headers (applies to the
        ``status_sequence`` answers too).
    redirect_to
        Answer ``redirect_status`` (302) with ``Location: redirect_to``
        (absolute or relative, sent verbatim) instead of the body.
    redirect_loop
        Answer ``redirect_status`` with ``Location`` = this very path, so a
        client loops forever.  (For an a->b->a loop, set ``redirect_to`` on
        both paths.)
    encoding
        Serve the body encoded with this real compressor (one of
        ``ENCODINGS``) with ``Content-Encoding`` set and ``Content-Length``
        of the encoded bytes.
    double_encoding
        ``(first, second)``: encode with ``first`` then ``second``; header
        ``Content-Encoding: first, second`` (the order of application).
    claimed_encoding
        Send ``Content-Encoding: <this>`` (e.g. ``"compress"``, ``"bogus"``,
        ``"gzip"``) over the bytes that would otherwise be sent -- the
        identity bytes unless ``encoding``/``double_encoding`` is also set,
        in which case this header value replaces theirs.
    gzip_bomb
        Ignore the stored body and serve a valid gzip stream (with
        ``Content-Encoding: gzip``) that decodes to this many zero bytes.
        Built without compressing the zeros (about ``n/1000`` bytes of
        memory, cached per size), so a 10 GiB bomb costs ~10 MB.
    ignore_range
        Answer 200 with the whole body even when a Range is asked
        (``Accept-Ranges: bytes`` is still advertised).
    no_accept_ranges
        Do not send ``Accept-Ranges`` and ignore Range (200, whole body).
    wrong_content_range
        For a satisfiable Range ``a-b``, answer 206 for ``a+1 .. b+1``
        instead (or ``a-1 .. b-1`` when ``b`` is the last byte; ``1 .. b``
        for a whole-body range), with that Content-Range and those bytes.
        Needs a body of at least 2 bytes; no effect without a Range.
    wrong_bytes
        Same status, headers and length, but every body byte inverted
        (``b ^ 0xFF``): the bytes differ at every position.
    truncate_at
        Announce the full Content-Length, send this many body bytes (of this
        response's body), then close the connection cleanly (FIN).
    reset_at
        Send this many body bytes, then abort the TCP connection with a RST
        (SO_LINGER 0 + ``transport.abort()``).  Before the RST the origin
        waits (up to 5 s) until the peer's kernel has acknowledged every
        byte before the cut (Linux SIOCOUTQ), so the client deterministically
        receives exactly ``reset_at`` bytes, then ECONNRESET.
    stall_at, stall_seconds
        After ``stall_at`` body bytes, send nothing for ``stall_seconds``
        (``None`` = forever, i.e. until the client goes away or the origin
        stops), then continue normally.  Headers are already sent, so
        ``stall_at=0`` is a stall right after the headers (use ``delay`` for
        a stall before them).
    extra_bytes
        After the complete announced body, write these bytes raw to the
        transport (bypassing aiohttp's Content-Length clipping), then close
        the connection (so no later response on it is corrupted).
    times
        See above: how many responses (after ``status_sequence``) get the
        fault; ``None`` = all.
    methods
        Methods the fault applies to.

    Byte positions (``*_at``) count body bytes of that response (not
    offsets in the resource); values at or beyond the announced length act
    at the end of the body.  At the same position a stall happens before a
    truncate/reset.  Body faults do nothing for HEAD.
    """

    status_sequence: Sequence[int] = ()
    retry_after: str | None = None
    delay: float = 0.0
    redirect_to: str | None = None
    redirect_loop: bool = False
    redirect_status: int = 302
    encoding: str | None = None
    double_encoding: tuple[str, str] | None = None
    claimed_encoding: str | None = None
    gzip_bomb: int | None = None
    ignore_range: bool = False
    no_accept_ranges: bool = False
    wrong_content_range: bool = False
    wrong_bytes: bool = False
    truncate_at: int | None = None
    reset_at: int | None = None
    stall_at: int | None = None
    stall_seconds: float | None = None
    extra_bytes: bytes = b""
    times: int | None = None
    methods: Sequence[str] = ("GET", "HEAD")

    def __post_init__(self) -> None:
        object.__setattr__(self, "status_sequence", tuple(int(s) for s in self.status_sequence))
        object.__setattr__(self, "methods", tuple(m.upper() for m in self.methods))
        if self.double_encoding is not None:
            object.__setattr__(self, "double_encoding", tuple(self.double_encoding))
            if len(self.double_encoding) != 2:
                raise ValueError("double_encoding takes exactly two encodings")
        for enc in (self.encoding, *(self.double_encoding or ())):
            if enc is not None and enc not in ENCODINGS:
                raise ValueError(f"unknown encoding {enc!r}; choose from {ENCODINGS}")
        if sum(x is not None for x in (self.encoding, self.double_encoding, self.gzip_bomb)) > 1:
            raise ValueError("encoding, double_encoding and gzip_bomb are exclusive")
        if self.redirect_to is not None and self.redirect_loop:
            raise ValueError("redirect_to and redirect_loop are exclusive")
        for name in ("truncate_at", "reset_at", "stall_at", "gzip_bomb", "times"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.delay < 0 or (self.stall_seconds is not None and self.stall_seconds < 0):
            raise ValueError("delays must be >= 0")


# --------------------------------------------------------------------------
# Bodies


class _Body:
    size: int

    def chunks(self, start: int, end: int, chunk_size: int) -> Iterator[bytes]:
        raise NotImplementedError


class _BytesBody(_Body):
    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)
        self.size = len(self.data)

    def chunks(self, start, end, chunk_size) -> Iterator[bytes]:
        view = memoryview(self.data)
        for off in range(start, end, chunk_size):
            yield bytes(view[off:min(off + chunk_size, end)])


class _FileBody(_Body):
    def __init__(self, path: Path, size: int | None = None) -> None:
        self.path = Path(path)
        self.size = self.path.stat().st_size if size is None else size

    def chunks(self, start, end, chunk_size) -> Iterator[bytes]:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            off = start
            while off < end:
                data = os.pread(fd, min(chunk_size, end - off), off)
                if not data:
                    raise OSError(f"{self.path} shrank while being served")
                off += len(data)
                yield data
        finally:
            os.close(fd)


def _compressor(name: str) -> tuple[Callable[[bytes], bytes], Callable[[], bytes]]:
    """(feed, finish) for a real streaming compressor."""
    if name == "identity":
        return (lambda b: b), (lambda: b"")
    if name in ("gzip", "deflate", "deflate-raw"):
        wbits = {"gzip": 31, "deflate": 15, "deflate-raw": -15}[name]
        c = zlib.compressobj(6, zlib.DEFLATED, wbits)  # gzip header mtime is 0
        return c.compress, c.flush
    if name == "br":
        c = brotli.Compressor()
        return c.process, c.finish
    if name == "zstd":
        c = zstandard.ZstdCompressor().compressobj()
        return c.compress, c.flush
    raise ValueError(f"unknown encoding {name!r}")


def _encode_stream(chunks: Iterator[bytes], name: str) -> Iterator[bytes]:
    feed, finish = _compressor(name)
    for c in chunks:
        out = feed(c)
        if out:
            yield out
    out = finish()
    if out:
        yield out


def encode(data: bytes, *chain: str) -> bytes:
    """Encode bytes with the same compressors the origin uses (for tests)."""
    stream: Iterator[bytes] = iter([data])
    for name in chain:
        stream = _encode_stream(stream, name)
    return b"".join(stream)


def _crc32_zeros(n: int) -> int:
    """zlib.crc32(bytes(n)) in O(log n), by GF(2) matrix powers."""

    def times(mat, vec) -> int:
        s, i = 0, 0
        while vec:
            if vec & 1:
                s ^= mat[i]
            vec >>= 1
            i += 1
        return s

    def square(mat) -> list[int]:
        return [times(mat, m) for m in mat]

    op = [0xEDB88320] + [1 << i for i in range(31)]  # one zero bit
    for _ in range(3):  # one zero byte
        op = square(op)
    vec = 0xFFFFFFFF
    while n:
        if n & 1:
            vec = times(op, vec)
        n >>= 1
        if n:
            op = square(op)
    return vec ^ 0xFFFFFFFF


_BOMBS: dict[int, bytes] = {}
_BOMB_LOCK = threading.Lock()


def gzip_bomb_bytes(n: int) -> bytes:
    """A gzip member that decodes to ``n`` zero bytes (cached per size).

    1 MiB of zeros compresses (raw deflate, full flush, fresh compressor) to
    a self-contained, byte-aligned, non-final block sequence; repeating it is
    a valid deflate stream, closed by a final block for the remainder.  The
    CRC of n zeros is computed arithmetically, so nothing of size n is ever
    built or compressed."""
    with _BOMB_LOCK:
        if n in _BOMBS:
            return _BOMBS[n]
        unit = 1 << 20
        k, rem = divmod(n, unit)
        parts = [b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"]
        if k:
            c = zlib.compressobj(9, zlib.DEFLATED, -15, 9)
            parts.append((c.compress(bytes(unit)) + c.flush(zlib.Z_FULL_FLUSH)) * k)
        c = zlib.compressobj(9, zlib.DEFLATED, -15, 9)
        parts.append(c.compress(bytes(rem)) + c.flush(zlib.Z_FINISH))
        parts.append(struct.pack("<II", _crc32_zeros(n), n & 0xFFFFFFFF))
        _BOMBS[n] = b"".join(parts)
        return _BOMBS[n]


# --------------------------------------------------------------------------
# State


@dataclass
class _Entry:
    body: _Body
    sha: str
    last_modified: str
    encoding: str | None = None
    fault: Fault | None = None
    statuses_used: int = 0
    times_used: int = 0
    reps: dict = field(default_factory=dict)  # coding chain -> _Body
    content_type: str = "application/octet-stream"


def _parse_range(value: str, size: int) -> tuple[int, int] | str | None:
    """None: ignore the header; "416": unsatisfiable; else (start, end_incl)."""
    value = value.strip()
    unit, sep, spec = value.partition("=")
    if not sep or unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    first, last = first.strip(), last.strip()
    if not dash or not (first.isdigit() or first == "") or not (last.isdigit() or last == ""):
        return None
    if first == "":
        if last == "":
            return None
        n = int(last)
        if n == 0 or size == 0:
            return "416"
        return max(0, size - n), size - 1
    a = int(first)
    b = int(last) if last else None
    if b is not None and b < a:
        return None
    if a >= size:
        return "416"
    return a, size - 1 if b is None or b >= size else b


# --------------------------------------------------------------------------
# The server


class Origin:
    """A real HTTP origin on 127.0.0.1 running in its own thread.

    ``start()``/``stop()`` or ``with Origin() as o:``.  Single use: once
    stopped it cannot be started again.  ``put*``/``set_fault``/``remove``
    work before and after start, from any thread."""

    def __init__(self, *, chunk_size: int = CHUNK_SIZE, shutdown_timeout: float = 2.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.chunk_size = chunk_size
        self.shutdown_timeout = shutdown_timeout
        self._ssl_context = ssl_context   # https where given
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._requests: list[Request] = []
        self._bytes: dict[str, int] = {}
        self._tmpdir: str | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False
        self._port: int | None = None
        # loop-thread-only state
        self._stopping: asyncio.Event | None = None
        self._live: set = set()
        self._runner: web.AppRunner | None = None

    # ---- lifecycle -------------------------------------------------------

    def start(self) -> Origin:
        if self._stopped:
            raise RuntimeError("Origin is single-use; create a new one")
        if self._thread is not None:
            return self
        ready = threading.Event()
        error: list[BaseException] = []
        loop = asyncio.new_event_loop()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._astart())
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                error.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                try:
                    loop.run_until_complete(self._astop())
                    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                    for t in pending:
                        t.cancel()
                    if pending:
                        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                    loop.run_until_complete(loop.shutdown_asyncgens())
                    loop.run_until_complete(loop.shutdown_default_executor())
                finally:
                    asyncio.set_event_loop(None)
                    loop.close()

        self._thread = threading.Thread(target=run, name="test-origin", daemon=True)
        self._thread.start()
        ready.wait()
        if error:
            self._thread.join()
            self._thread = None
            raise error[0]
        return self

    async def _astart(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application(client_max_size=1 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            app, handle_signals=False, access_log=None, shutdown_timeout=self.shutdown_timeout
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, reuse_address=True, ssl_context=self._ssl_context)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def _astop(self) -> None:
        self._stopping.set()
        for tr in list(self._live):
            tr.abort()
        await self._runner.cleanup()

    def stop(self) -> None:
        if self._thread is not None and not self._stopped:
            self._stopped = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            if self._thread.is_alive():  # pragma: no cover
                raise RuntimeError("origin thread did not stop")
        self._stopped = True
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> Origin:  # not subclassed
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- addressing ------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("Origin not started")
        return self._port

    @property
    def base_url(self) -> str:
        return f"{'https' if self._ssl_context is not None else 'http'}://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base_url + _norm(path)

    # ---- content ---------------------------------------------------------

    def put(self, path: str, data: bytes, *, fault: Fault | None = None,
            encoding: str | None = None, last_modified: float | None = None,
            content_type: str = "application/octet-stream") -> str:
        """Serve ``data`` at ``path`` (GET and HEAD); returns its URL if
        started (else the path).  ``encoding`` encodes every response."""
        data = bytes(data)
        body = _BytesBody(data)
        sha = hashlib.sha256(data).hexdigest()
        return self._install(path, body, sha, time.time() if last_modified is None else last_modified,
                             fault, encoding, content_type)

    def put_file(self, path: str, file_path: str | os.PathLike, *, fault: Fault | None = None,
                 encoding: str | None = None, etag: str | None = None) -> str:
        """Serve the file's bytes at ``path``, read from disk per chunk.
        The file is hashed once for the ETag unless ``etag`` (unquoted) is
        given; Last-Modified is its mtime.  Do not change the file while it
        is being served."""
        file_path = Path(file_path)
        st = file_path.stat()
        body = _FileBody(file_path, st.st_size)
        if etag is None:
            h = hashlib.sha256()
            for c in body.chunks(0, body.size, 1 << 20):
                h.update(c)
            etag = h.hexdigest()
        return self._install(path, body, etag, st.st_mtime, fault, encoding)

    def _install(self, path, body, sha, mtime, fault, encoding,
                 content_type: str = "application/octet-stream") -> _Entry:
        path = _norm(path)
        if encoding is not None and encoding not in ENCODINGS:
            raise ValueError(f"unknown encoding {encoding!r}")
        entry = _Entry(body=body, sha=sha, encoding=encoding, content_type=content_type,
                       last_modified=email.utils.formatdate(mtime, usegmt=True))
        if encoding is not None:
            self._prepare_rep(entry, (encoding,))
        self._prepare_fault(entry, fault)
        entry.fault = fault
        with self._lock:
            self._entries[path] = entry
        return self.url(path) if self._port is not None else path

    def set_fault(self, path: str, fault: Fault | None) -> None:
        """Set (or with None clear) the fault of a stored path; resets its
        counters."""
        path = _norm(path)
        with self._lock:
            entry = self._entries.get(path)
        if entry is None:
            raise KeyError(path)
        self._prepare_fault(entry, fault)
        with self._lock:
            entry.fault = fault
            entry.statuses_used = 0
            entry.times_used = 0

    def remove(self, path: str) -> None:
        with self._lock:
            self._entries.pop(_norm(path), None)

    def _prepare_fault(self, entry: _Entry, fault: Fault | None) -> None:
        if fault is None:
            return
        if fault.encoding is not None:
            self._prepare_rep(entry, (fault.encoding,))
        if fault.double_encoding is not None:
            self._prepare_rep(entry, tuple(fault.double_encoding))
        if fault.gzip_bomb is not None:
            gzip_bomb_bytes(fault.gzip_bomb)

    def _prepare_rep(self, entry: _Entry, chain: tuple[str, ...]) -> None:
        if chain in entry.reps:
            return
        stream = entry.body.chunks(0, entry.body.size, self.chunk_size)
        for name in chain:
            stream = _encode_stream(stream, name)
        if entry.body.size <= _IN_MEMORY_LIMIT:
            rep: _Body = _BytesBody(b"".join(stream))
        else:
            if self._tmpdir is None:
                self._tmpdir = tempfile.mkdtemp(prefix="test-origin-")
            fd, name = tempfile.mkstemp(dir=self._tmpdir)
            with os.fdopen(fd, "wb") as f:
                for c in stream:
                    f.write(c)
            rep = _FileBody(Path(name))
        entry.reps[chain] = rep

    # ---- observation -----------------------------------------------------

    @property
    def requests(self) -> list[Request]:
        """A snapshot (copy) of the recorded requests, oldest first."""
        with self._lock:
            return list(self._requests)

    def count(self, path: str, method: str | None = "GET") -> int:
        """Requests recorded for ``path`` with ``method`` (None: any)."""
        path = _norm(path)
        with self._lock:
            return sum(1 for r in self._requests
                       if r.path == path and (method is None or r.method == method.upper()))

    def reset_counts(self) -> None:
        """Forget recorded requests and byte counters (fault counters stay)."""
        with self._lock:
            self._requests.clear()
            self._bytes.clear()

    @property
    def bytes_sent(self) -> int:
        """Body bytes written to sockets (incl. extra_bytes), all paths."""
        with self._lock:
            return sum(self._bytes.values())

    def bytes_sent_for(self, path: str) -> int:
        with self._lock:
            return self._bytes.get(_norm(path), 0)

    def _add_bytes(self, path: str, n: int) -> None:
        with self._lock:
            self._bytes[path] = self._bytes.get(path, 0) + n

    # ---- serving ---------------------------------------------------------

    async def _wait(self, seconds: float | None, transport) -> bool:
        """Sleep ``seconds`` (None: forever); False if the client went away
        or the origin is stopping first."""
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        while True:
            if self._stopping.is_set() or transport is None or transport.is_closing():
                return False
            now = loop.time()
            if deadline is not None and now >= deadline:
                return True
            await asyncio.sleep(0.02 if deadline is None else min(0.02, deadline - now))

    async def _flush(self, transport) -> None:
        while (transport is not None and not transport.is_closing()
               and transport.get_write_buffer_size() > 0 and not self._stopping.is_set()):
            await asyncio.sleep(0.001)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        method = request.method
        transport = request.transport
        with self._lock:
            self._requests.append(Request(
                method=method, path=path,
                headers=HeaderDict(request.headers.items()),
                range=request.headers.get("Range"), time=time.monotonic(),
                query=request.query_string))
            entry = self._entries.get(path)
            fault, status = None, None
            if entry is not None and entry.fault is not None and method in entry.fault.methods:
                f = entry.fault
                if entry.statuses_used < len(f.status_sequence):
                    status = f.status_sequence[entry.statuses_used]
                    entry.statuses_used += 1
                    fault = f
                elif f.times is None or entry.times_used < f.times:
                    entry.times_used += 1
                    fault = f
        if entry is None:
            return web.Response(status=404, text="not found\n")
        if method not in ("GET", "HEAD"):
            return web.Response(status=405, headers={"Allow": "GET, HEAD"})
        if transport is not None:
            self._live.add(transport)
        try:
            return await self._respond(request, path, entry, fault, status)
        finally:
            self._live.discard(transport)

    async def _respond(self, request, path, entry: _Entry, fault: Fault | None, status: int | None) -> web.StreamResponse:
        transport = request.transport
        head = request.method == "HEAD"
        if fault is not None and fault.delay and not await self._wait(fault.delay, transport):
            return _gone(transport)

        if status is not None:
            headers = {"Content-Type": "text/plain"}
            if fault.retry_after is not None:
                headers["Retry-After"] = fault.retry_after
            body = b"" if status in (204, 304) or status < 200 else f"injected {status}\n".encode()
            return web.Response(status=status, body=body, headers=headers)

        if fault is not None and (fault.redirect_to is not None or fault.redirect_loop):
            location = fault.redirect_to if fault.redirect_to is not None else request.path_qs
            return web.Response(status=fault.redirect_status, headers={"Location": location},
                                body=b"redirect\n")

        # -- representation
        coding = None
        if fault is not None and fault.gzip_bomb is not None:
            body: _Body = _BytesBody(gzip_bomb_bytes(fault.gzip_bomb))
            coding, etag = ("gzip",), f'"bomb-{fault.gzip_bomb}"'
        else:
            if fault is not None and fault.double_encoding is not None:
                coding = tuple(fault.double_encoding)
            elif fault is not None and fault.encoding is not None:
                coding = (fault.encoding,)
            elif entry.encoding is not None:
                coding = (entry.encoding,)
            if coding == ("identity",):
                coding = None
            body = entry.reps[coding] if coding else entry.body
            etag = f'"{entry.sha[:32]}{"-" + "+".join(coding) if coding else ""}"'
        headers = {"Content-Type": entry.content_type, "ETag": etag,
                   "Last-Modified": entry.last_modified}
        header_coding = None
        if coding:
            header_coding = ", ".join("deflate" if c == "deflate-raw" else c for c in coding)
        if fault is not None and fault.claimed_encoding is not None:
            header_coding = fault.claimed_encoding
        if header_coding:
            headers["Content-Encoding"] = header_coding

        # -- range
        size = body.size
        accept_ranges = not (fault is not None and fault.no_accept_ranges)
        if accept_ranges:
            headers["Accept-Ranges"] = "bytes"
        start, end, status = 0, size, 200  # end exclusive
        range_header = request.headers.get("Range")
        if range_header is not None and accept_ranges and not (fault is not None and fault.ignore_range):
            if_range = request.headers.get("If-Range")
            if if_range is None or if_range.strip() in (etag, entry.last_modified):
                parsed = _parse_range(range_header, size)
                if parsed == "416":
                    headers["Content-Range"] = f"bytes */{size}"
                    return web.Response(status=416, headers=headers, body=b"")
                if parsed is not None:
                    a, b = parsed
                    if fault is not None and fault.wrong_content_range and size >= 2:
                        if b + 1 < size:
                            a, b = a + 1, b + 1
                        elif a > 0:
                            a, b = a - 1, b - 1
                        else:
                            a = 1
                    start, end, status = a, b + 1, 206
                    headers["Content-Range"] = f"bytes {a}-{b}/{size}"

        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = end - start
        if fault is not None and fault.extra_bytes:
            resp.force_close()
        await resp.prepare(request)
        if head:
            return resp
        await self._send_body(request, resp, path, body, start, end, fault)
        return resp

    async def _send_body(self, request, resp, path, body: _Body, start, end, fault) -> None:
        transport = request.transport
        total = end - start
        stall_at = truncate_at = reset_at = None
        wrong = False
        if fault is not None:
            wrong = fault.wrong_bytes
            if fault.stall_at is not None:
                stall_at = min(fault.stall_at, total)
            if fault.truncate_at is not None:
                truncate_at = min(fault.truncate_at, total)
            if fault.reset_at is not None:
                reset_at = min(fault.reset_at, total)
        sent = 0

        async def events() -> bool:
            """Act on faults due at ``sent``; False ends the response."""
            nonlocal stall_at
            if stall_at is not None and sent >= stall_at:
                stall_at = None
                await self._flush(transport)
                if not await self._wait(fault.stall_seconds, transport):
                    _gone(transport)
                    return False
            if truncate_at is not None and sent >= truncate_at:
                await self._flush(transport)
                transport.close()
                return False
            if reset_at is not None and sent >= reset_at:
                await self._flush(transport)
                # A RST discards what the kernel has not delivered yet: wait
                # (bounded) until the peer has acknowledged every byte.
                sock = transport.get_extra_info("socket")
                deadline = asyncio.get_running_loop().time() + 5.0
                while (sock is not None and _unacked(sock) > 0 and not self._stopping.is_set()
                       and asyncio.get_running_loop().time() < deadline):
                    await asyncio.sleep(0.001)
                _rst(transport)
                return False
            return True

        gen = body.chunks(start, end, self.chunk_size)
        try:
            for chunk in gen:
                while chunk:
                    if not await events():
                        return
                    n = len(chunk)
                    for cut in (stall_at, truncate_at, reset_at):
                        if cut is not None and cut > sent:
                            n = min(n, cut - sent)
                    piece, chunk = chunk[:n], chunk[n:]
                    if wrong:
                        piece = piece.translate(_INVERT)
                    if transport is None or transport.is_closing() or self._stopping.is_set():
                        _gone(transport)
                        return
                    # counted before the await: resp.write hands the bytes to
                    # the transport synchronously, so a client never holds
                    # bytes the counter does not show yet
                    self._add_bytes(path, len(piece))
                    sent += len(piece)
                    await resp.write(piece)
            if not await events():
                return
            if fault is not None and fault.extra_bytes:
                await self._flush(transport)
                if transport is not None and not transport.is_closing():
                    self._add_bytes(path, len(fault.extra_bytes))
                    transport.write(fault.extra_bytes)
                    await self._flush(transport)
                    transport.close()
        except ConnectionError:
            _gone(transport)
        finally:
            gen.close()


def _norm(path: str) -> str:
    return path if path.startswith("/") else "/" + path


def _gone(transport) -> web.Response:
    if transport is not None and not transport.is_closing():
        transport.abort()
    return web.Response(status=499)


def _unacked(sock) -> int:
    """Bytes in the kernel send queue not yet acknowledged by the peer
    (Linux SIOCOUTQ); 0 where unsupported."""
    try:
        import fcntl
        import termios

        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (ImportError, OSError, AttributeError, ValueError):
        return 0


def _rst(transport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()

