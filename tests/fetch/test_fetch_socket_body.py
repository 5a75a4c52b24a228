"""Big plain-HTTP bodies are read from their socket by the stream's own
thread (cartonstore/fetch/http/socket_body.py), not received on the event loop.

Every fault of test_fetch_faults.py runs on this path too (its body_path
fixture); here: which bodies take it and which do not, what it leaves open,
and a pull cancelled in the middle of one.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest
from kit.daemonkit import wait_for, wait_for_async
from kit.fetchkit import URLS_ONLY, fast_config, linked_carton, pull, tmp_files
from kit.origin import Fault, Origin

from cartonstore.fetch.http import socket_body
from cartonstore.fetch.http.config import RegistryConfig
from cartonstore.fetch.puller import Puller, PullResult
from cartonstore.store import Store

BIG = os.urandom(socket_body.DIRECT_MIN + (1 << 20) + 12_345)


@pytest.fixture
def direct_reads(monkeypatch) -> list[int | str]:
    """What each direct read did (socket_body.receive, called through): the
    bytes it handed over, or the name of the error it raised."""
    seen: list[int | str] = []
    real = socket_body.receive

    def counting(*args, **kw) -> int:
        try:
            got = real(*args, **kw)
        except Exception as e:
            seen.append(type(e).__name__)
            raise
        seen.append(got)
        return got

    monkeypatch.setattr(socket_body, "receive", counting)
    return seen


def open_fds() -> set[str]:
    """The sockets and pipes this process holds open."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own fd
            continue
        if target.startswith(("socket:", "pipe:")):
            out.add(target)
    return out


def none_left_open(before: set[str]) -> bool:
    """No socket or pipe beyond ``before``, once the origin (a thread of this
    process) has closed its side of the connections the pull closed."""
    return wait_for(lambda: open_fds() <= before, 5, 0.02)


def fetch_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("cartonstore-")]


def pull_on(loop: str, store: Store, source: str) -> PullResult:
    """fetchkit.pull on asyncio's loop or on uvloop's (the daemon's)."""
    async def run() -> PullResult:
        async with Puller(store, fast_config(), sources=URLS_ONLY) as p:
            return await p.add(source)

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.run(run())
    return asyncio.run(run())


def warm(loop: str) -> None:
    """libuv keeps a few fds for the process once first used: not the pull's."""
    if loop == "uvloop":
        pytest.importorskip("uvloop").run(asyncio.sleep(0))


@pytest.mark.parametrize(("encoding", "loop"), [(None, "asyncio"), ("zstd", "asyncio"), ("gzip", "asyncio"),
                                                (None, "uvloop"), ("zstd", "uvloop")])
def test_a_big_body_is_read_from_its_socket(store: Store, tmp_path: Path, origin, direct_reads,
                                           encoding: str | None, loop: str) -> None:
    carton, shas = linked_carton(tmp_path, origin, {"model/w.bin": BIG})
    if encoding:  # random bytes: the encoded body is as big
        origin.set_fault(f"/blobs/{shas['model/w.bin']}", Fault(encoding=encoding))
    warm(loop)
    before = open_fds()
    assert pull_on(loop, store, str(carton)).complete
    assert store.blobs.path(shas["model/w.bin"]).read_bytes() == BIG
    assert len(direct_reads) == 1 and direct_reads[0] > socket_body.DIRECT_MIN
    assert none_left_open(before), "a duplicated socket or a stop pipe was left open"
    assert tmp_files(store) == [] and fetch_threads() == []


def test_small_bodies_keep_aiohttp_and_their_connection(store: Store, tmp_path: Path, origin,
                                                      direct_reads) -> None:
    carton, _ = linked_carton(tmp_path, origin, {"model/a.bin": os.urandom(300_000),
                                                    "model/b.bin": os.urandom(200_000)})
    assert pull(store, str(carton)).complete
    assert direct_reads == []


def test_parts_of_a_big_body_are_each_read_from_their_socket(store: Store, tmp_path: Path, origin,
                                                             direct_reads) -> None:
    payload = os.urandom(4 * socket_body.DIRECT_MIN)
    carton, shas = linked_carton(tmp_path, origin, {"model/w.bin": payload})
    digest = shas["model/w.bin"]
    # The first part ends early once (the others are read whole): it resumes where its bytes end.
    origin.set_fault(f"/blobs/{digest}", Fault(reset_at=socket_body.DIRECT_MIN // 2, times=1))
    assert pull(store, str(carton), fast_config(parallel_threshold=1 << 20, parallel_parts=4)).complete
    assert store.blobs.path(digest).read_bytes() == payload
    gets = [r for r in origin.requests if r.path == f"/blobs/{digest}"]
    # Part 0 broke off (its resumed half is under DIRECT_MIN: through aiohttp); 1-3 were read whole.
    assert len(gets) == 5 and sorted(direct_reads, key=str) == [socket_body.DIRECT_MIN] * 3 + ["FetchError"]


def test_tls_bodies_stay_with_aiohttp(store: Store, tmp_path: Path, direct_reads) -> None:
    """Over TLS the socket holds ciphertext: the body goes through aiohttp."""
    from kit.peerkit import make_pki

    pki = make_pki(tmp_path / "pki")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(pki["node.pem"], pki["node.key"])
    with Origin(ssl_context=server) as origin:
        carton, shas = linked_carton(tmp_path, origin, {"model/w.bin": BIG})
        config = fast_config(registries=RegistryConfig(ca_file=pki["ca.pem"]))
        assert pull(store, str(carton), config).complete
    assert store.blobs.path(shas["model/w.bin"]).read_bytes() == BIG
    assert direct_reads == []


def test_a_stalled_direct_read_times_out_and_resumes(store: Store, tmp_path: Path, origin,
                                                     direct_reads) -> None:
    """The retry says why as the aiohttp path does ("timed out", not the
    EAGAIN of the last read), and resumes after the bytes received."""
    carton, shas = linked_carton(tmp_path, origin, {"model/w.bin": BIG})
    digest = shas["model/w.bin"]
    origin.set_fault(f"/blobs/{digest}", Fault(stall_at=len(BIG) // 2, stall_seconds=5, times=1))
    events: list[dict] = []

    async def run() -> PullResult:
        async with Puller(store, fast_config(), sources=URLS_ONLY, on_event=events.append) as p:   # stall_timeout 0.5 s
            return await p.add(str(carton))

    assert asyncio.run(run()).complete
    assert store.blobs.path(digest).read_bytes() == BIG
    assert direct_reads[0] == "FetchError"
    reasons = [e["reason"] for e in events if e["event"] == "retry"]
    assert len(reasons) == 1 and reasons[0].startswith("timed out"), reasons
    gets = [r for r in origin.requests if r.path == f"/blobs/{digest}"]
    assert len(gets) == 2 and gets[1].range is not None and gets[1].range != "bytes=0-"


def test_a_pull_cancelled_in_a_direct_read_stops_its_thread(store: Store, tmp_path: Path, origin,
                                                           direct_reads) -> None:
    """Cancelled while the socket stalls (the stall timeout is far off): the
    thread is woken, not waited out, and leaves no file, fd or thread."""
    carton, shas = linked_carton(tmp_path, origin, {"model/w.bin": BIG})
    digest = shas["model/w.bin"]
    origin.set_fault(f"/blobs/{digest}", Fault(stall_at=len(BIG) // 2, stall_seconds=30))
    before = open_fds()

    async def run() -> float:
        async with Puller(store, fast_config(stall_timeout=30), sources=URLS_ONLY) as p:
            task = asyncio.ensure_future(p.add(str(carton)))
            assert await wait_for_async(lambda: origin.bytes_sent_for(f"/blobs/{digest}") >= len(BIG) // 2)
            await asyncio.sleep(0.2)   # into the stall: the reading thread waits in recv (no outside view of that)
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return time.monotonic() - started

    took = asyncio.run(run())
    assert took < 5, f"the cancel took {took:.1f} s: the reading thread was waited out"
    assert direct_reads and direct_reads[0] < len(BIG)
    assert tmp_files(store) == [] and fetch_threads() == []
    assert none_left_open(before)


class TricklingServer:
    """A raw HTTP/1.1 server (a thread, 127.0.0.1) whose one body starts
    slow: 4 KiB every 50 ms for ``slow_for`` seconds, far under
    LOW_WATER per stall_timeout, then the rest at once."""

    def __init__(self, body: bytes, slow_for: float) -> None:
        self.body, self.slow_for = body, slow_for
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/blob"
        self.gets = 0
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed: done
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536)
                self.gets += 1
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(self.body))
                sent, until = 0, time.monotonic() + self.slow_for
                while time.monotonic() < until:
                    conn.sendall(self.body[sent:sent + 4096])
                    sent += 4096
                    time.sleep(0.05)
                conn.sendall(self.body[sent:])

    def close(self) -> None:
        self.listener.close()
        self.thread.join(5)


@pytest.mark.slow
def test_a_slow_body_is_not_taken_for_a_stalled_one(store: Store, tmp_path: Path, origin,
                                                    direct_reads) -> None:
    """Bytes keep coming, under LOW_WATER per stall_timeout (0.5 s): poll does
    not wake for them, but the quiet socket is read anyway, and the body is
    received in one request, as through aiohttp."""
    from conftest import sha

    server = TricklingServer(BIG, slow_for=1.5)
    try:
        carton, _ = linked_carton(tmp_path, origin, {"model/w.bin": BIG}, urls={"model/w.bin": [server.url]})
        assert pull(store, str(carton)).complete
    finally:
        server.close()
    assert store.blobs.path(sha(BIG)).read_bytes() == BIG
    assert server.gets == 1 and direct_reads == [len(BIG)]


def test_a_remote_zips_big_span_is_read_from_its_socket(store: Store, tmp_path: Path, origin,
                                                        direct_reads) -> None:
    """The entries a remote carton lacks come in Range requests over its
    zip: a big one is read directly too, and parsed in that thread."""
    import zipfile

    from conftest import MINIMAL_TOML, carton_entries, sha, write_zip

    files = {"carton.toml": MINIMAL_TOML, "model/w.bin": BIG}
    origin.put_file("/big.carton", write_zip(tmp_path / "big.carton", carton_entries(files), method=zipfile.ZIP_STORED))
    assert pull(store, origin.url("/big.carton")).complete
    assert store.blobs.path(sha(BIG)).read_bytes() == BIG
    assert len(direct_reads) == 1 and direct_reads[0] > len(BIG)
    assert tmp_files(store) == [] and fetch_threads() == []
