"""The daemon's front connection (cartonstore/server/http/connection.py): inference
answered by the front itself, every other request by aiohttp, on one
keep-alive connection. A real daemon and runner; requests written byte for
byte on a real Unix socket, so framing, pipelining and connection reuse are
what is tested, not a client library's view of them."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import short_dir
from kit.daemonkit import DaemonProcess, wait_for
from kit.inferkit import echo_carton, in_flight, runner_pids
from test_infer_api import _load, runner_count

from cartonstore.v2.http1 import BadHead, for_one_request, parse_request_head, without_connection_close

HL = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def served() -> Iterator[DaemonProcess]:
    with short_dir() as base:
        config = base / "cartonstore.toml"
        config.write_text('[server]\nmax_request_size = "1MiB"\n')
        d = DaemonProcess(base / "root", extra_args=["--config", str(config)], log_file=base / "daemon.log").start()
        _load(d, "echo", echo_carton(base / "echo", dtypes=["float32"]))
        yield d
        d.stop()
        assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)


class Conn:
    """One raw HTTP/1.1 connection, answers read by their framing."""

    def __init__(self, address: Path | tuple[str, int]) -> None:
        """address: a Unix socket's path, or a TCP (host, port)."""
        family = socket.AF_INET if isinstance(address, tuple) else socket.AF_UNIX
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.settimeout(20)
        self.sock.connect(address if isinstance(address, tuple) else str(address))
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(1 << 20)
        self.buf += chunk
        return bool(chunk)

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise EOFError(f"connection closed with {len(self.buf)} of {n} bytes")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise EOFError(f"connection closed before an answer: {self.buf!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if status < 200:
            return status, headers, b""
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                while b"\r\n" not in self.buf:
                    self._fill()
                size_line, self.buf = self.buf.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                body += self._take(size + 2)[:size]
                if size == 0:
                    return status, headers, body
        return status, headers, self._take(int(headers.get("content-length", 0)))

    def closed_by_peer(self) -> bool:
        try:
            return not self.buf and self.sock.recv(1) == b""
        except (TimeoutError, ConnectionResetError):
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def infer_request(values: list[float], *, name: str = "echo", extra: bytes = b"", chunked: bool = False) -> bytes:
    data = np.asarray(values, dtype=np.float32).reshape(1, -1)
    header = json.dumps({"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": list(data.shape),
                                     "parameters": {"binary_data_size": data.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    body = header + data.tobytes()
    head = (f"POST /v2/models/{name}/infer HTTP/1.1\r\nHost: x\r\n{HL}: {len(header)}\r\n"
            "Content-Type: application/octet-stream\r\n").encode() + extra
    if chunked:
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def echoed(answer: tuple[int, dict[str, str], bytes]) -> list[float]:
    status, headers, body = answer
    assert status == 200, body[:500]
    length = int(headers[HL.lower()])
    out = json.loads(body[:length])["outputs"][0]
    return np.frombuffer(body[length:], dtype=np.float32).tolist() if "data" not in out else out["data"]


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


def post_json(path: str, doc: dict) -> bytes:
    body = json.dumps(doc).encode()
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def test_infer_and_other_requests_share_one_keep_alive_connection(served: DaemonProcess) -> None:
    with Conn(served.socket_path) as c:
        c.send(get("/v2/health/ready"))
        status, headers, _ = c.answer()
        assert status == 200 and "close" not in headers.get("connection", "")   # aiohttp's close is not passed on
        c.send(infer_request([1, 2, 3]))
        assert echoed(c.answer()) == [1, 2, 3]
        c.send(get("/v2/models/echo/ready"))
        assert c.answer()[0] == 200
        c.send(post_json("/v2/repository/index", {}))
        status, _, body = c.answer()
        assert status == 200 and any(m["name"] == "echo" for m in json.loads(body))
        c.send(infer_request([4, 5]))
        assert echoed(c.answer()) == [4, 5]


def test_pipelined_requests_are_answered_in_order(served: DaemonProcess) -> None:
    with Conn(served.socket_path) as c:
        c.send(infer_request([1]) + get("/v2/models/echo") + infer_request([2]) + get("/v2/health/live"))
        assert echoed(c.answer()) == [1]
        status, _, body = c.answer()
        assert status == 200 and json.loads(body)["name"] == "echo"
        assert echoed(c.answer()) == [2]
        assert c.answer()[0] == 200


def test_a_chunked_infer_request_is_answered_by_aiohttp_on_the_same_connection(served: DaemonProcess) -> None:
    with Conn(served.socket_path) as c:
        c.send(infer_request([7, 8], chunked=True))
        assert echoed(c.answer()) == [7, 8]
        c.send(get("/v2/health/live"))
        assert c.answer()[0] == 200


def test_expect_100_continue_is_answered_before_the_body(served: DaemonProcess) -> None:
    with Conn(served.socket_path) as c:
        request = infer_request([3], extra=b"Expect: 100-continue\r\n")
        head, body = request.split(b"\r\n\r\n", 1)
        c.send(head + b"\r\n\r\n")
        assert c.answer()[0] == 100
        c.send(body)
        assert echoed(c.answer()) == [3]


def test_an_unknown_model_is_refused_and_its_body_dropped_keeping_the_connection(served: DaemonProcess) -> None:
    before = runner_count(served, "echo")
    with Conn(served.socket_path) as c:
        request = infer_request(list(range(20_000)), name="nope")   # ~80 KB: arrives in several reads
        c.send(request[:3000])
        status, _, body = c.answer()   # refused before the body is read
        assert status == 404 and "Request for unknown model: 'nope' is not found" in json.loads(body)["error"]
        c.send(request[3000:] + infer_request([9]))
        assert echoed(c.answer()) == [9]
    assert runner_count(served, "echo") == before + 1


def test_too_large_is_413_and_the_connection_ends(served: DaemonProcess) -> None:
    with Conn(served.socket_path) as c:
        head = (f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n{HL}: 10\r\n"
                f"Content-Length: {5 << 20}\r\n\r\n").encode()
        c.send(head)
        status, headers, body = c.answer()
        assert status == 413 and "max_request_size" in json.loads(body)["error"]
        assert headers["connection"] == "close"
        c.send(b"\0" * (5 << 20))   # taken and dropped (a client that sends first, reads after, gets its 413)
        assert c.closed_by_peer()


@pytest.mark.parametrize("raw, status, words", [
    (b"POST /v2/models/echo/infer HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 400, "Content-Length is not a length"),
    ("POST /v2/models/echo/infer HTTP/1.1\r\nContent-Length: \u00b2\r\n\r\n".encode("latin-1"), 400,
     "is not a length"),
    (b"POST /v2/models/echo/infer HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", 400,
     "is not a length"),
    (b"GARBAGE\r\n\r\n", 400, "bad request line"),
    (b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 400, "bad header line"),
    (b"GET / HTTP/1.1\r\nAuthorization: Bearer\r\n abc\r\n\r\n", 400, "folded continuation of 'Authorization'"),
    (b"GET / HTTP/1.1\r\nX: " + b"a" * 70_000, 431, "request head longer"),
    (b"POST /v2/models/echo/infer HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400,
     "more than one Content-Length"),
])
def test_a_head_that_cannot_be_read_is_answered_and_closed(served: DaemonProcess, raw: bytes, status: int,
                                                           words: str) -> None:
    before = runner_count(served, "echo")
    with Conn(served.socket_path) as c:
        c.send(raw)
        got, headers, body = c.answer()
        assert got == status and words in json.loads(body)["error"], body
        assert headers["connection"] == "close" and c.closed_by_peer()
    assert runner_count(served, "echo") == before


SECRET = "s3cr3t-t0ken-9f8e7d"


@pytest.mark.parametrize("head", [
    f"GET /v2/models HTTP/1.1\r\nAuthorization: Bearer\r\n {SECRET}",   # folded (obs-fold): the token alone
    f"GET /v2/models HTTP/1.1\r\nAuthorization: Bearer\r\n\t{SECRET}",
    f"GET /v2/models HTTP/1.1\r\nAuthorization Bearer {SECRET}:x",     # no ':' after a name, one in the value
    f"GET /v2/models HTTP/1.1\r\nAuthorization Bearer {SECRET}",       # no ':' at all
    f"GET /v2/models HTTP/1.1\r\nX-Token: {SECRET}\0",                 # a NUL in the value
    f"Authorization: Bearer {SECRET}\r\nHost: x",                      # no request line: a header first
])
def test_a_bad_head_is_named_without_echoing_a_header_value(served: DaemonProcess, head: str) -> None:
    raw = f"{head}\r\n\r\n".encode("latin-1")
    with pytest.raises(BadHead) as refused:
        parse_request_head(raw)
    assert SECRET not in str(refused.value) and "bad " in str(refused.value)
    with Conn(served.socket_path) as c:
        c.send(raw)
        status, _, body = c.answer()
    assert status == 400 and SECRET.encode() not in body, body
    log = served.log_file.read_text()   # type: ignore[union-attr]  # served with a log file
    assert str(refused.value) in log and SECRET not in log


def test_connection_close_is_honoured_on_infer(served: DaemonProcess) -> None:
    with Conn(served.socket_path) as c:
        c.send(infer_request([1], extra=b"Connection: close\r\n"))
        status, headers, _ = c.answer()
        assert status == 200 and headers["connection"] == "close" and c.closed_by_peer()


def test_a_client_gone_mid_body_never_reaches_the_runner(served: DaemonProcess) -> None:
    before = runner_count(served, "echo")
    c = Conn(served.socket_path)
    c.send(infer_request(list(range(1000)))[:2000])
    c.close()
    time.sleep(0.3)   # nothing to wait for: the time a daemon that forwarded the broken request would take
    with Conn(served.socket_path) as c:
        c.send(infer_request([5]))
        assert echoed(c.answer()) == [5]
    assert runner_count(served, "echo") == before + 1


def test_heads_parse_and_rewrite() -> None:
    raw = b"POST /a?b=1 HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
    head = parse_request_head(raw)
    assert (head.method, head.path, head.version, head.keep_alive) == ("POST", "/a", "1.1", True)
    assert head.headers["x-a"] == "1, 2" and head.content_length() == 0
    assert parse_request_head(raw.replace(b"HTTP/1.1", b"HTTP/1.0")).keep_alive is False
    assert parse_request_head(b"GET / HTTP/1.0\r\n\r\n").keep_alive is False
    assert parse_request_head(b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").content_length() is None
    once = for_one_request(head)
    assert b"keep-alive" not in once and once.endswith(b"X-A: 1\r\nx-a: 2\r\nConnection: close\r\n\r\n")
    assert without_connection_close(b"HTTP/1.1 200 OK\r\nConnection: close\r\nA: b\r\n\r\n") == \
        b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n"
    for bad in (b"GET / HTTP/2\r\n\r\n", b"GET / HTTP/1.1\r\nA: b\r\n", b"GET / HTTP/1.1\r\nA\r\n\r\n",
                b"GET / HTTP/1.1\r\nA: b\0c\r\n\r\n"):
        with pytest.raises(BadHead):
            parse_request_head(bad)


def test_on_asyncios_loop_too_infers_and_relayed_requests_share_a_connection(short_tmp: Path) -> None:
    """The daemon serves on asyncio's loop when told (what the relay needs
    of that loop, no native sendfile, is pinned in test_relay_contract.py)."""
    d = DaemonProcess(short_tmp / "root", env={"CARTONSTORE_EVENT_LOOP": "asyncio"}).start()
    try:
        _load(d, "echo", echo_carton(short_tmp / "echo", dtypes=["float32"]))
        test_infer_and_other_requests_share_one_keep_alive_connection(d)
        test_pipelined_requests_are_answered_in_order(d)
    finally:
        d.stop()
    assert "(asyncio event loop)" in d.proc.stderr.read()   # the "serving" line names the loop
    assert wait_for(lambda: not runner_pids(d.root), 10)


def test_an_unknown_event_loop_is_refused_by_name(short_tmp: Path) -> None:
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "cartonstore.cli", "serve", "--root", str(short_tmp / "root"),
                        "--socket", str(short_tmp / "s.sock")], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "CARTONSTORE_EVENT_LOOP": "trio"})
    assert r.returncode == 4 and "CARTONSTORE_EVENT_LOOP='trio': use uvloop or asyncio" in r.stderr, r.stderr


def test_malloc_keeps_big_buffers_unless_the_environment_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    from cartonstore.system.malloc_tuning import keep_big_buffers

    assert keep_big_buffers() is True   # glibc: this test machine's libc
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert keep_big_buffers() is False


@pytest.mark.slow
def test_a_refused_body_that_never_comes_ends_the_connection_after_the_linger(served: DaemonProcess) -> None:
    with Conn(served.socket_path) as c:
        c.send((f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n{HL}: 10\r\n"
                f"Content-Length: {5 << 20}\r\n\r\n").encode() + b"\0" * 1000)   # then nothing more
        started = time.monotonic()
        assert c.answer()[0] == 413
        assert c.closed_by_peer() and time.monotonic() - started < 15   # LINGER is 5 s
    with Conn(served.socket_path) as c:   # the daemon itself is unharmed
        c.send(infer_request([2]))
        assert echoed(c.answer()) == [2]


def test_leases_are_answered_by_the_front_on_one_connection(served: DaemonProcess) -> None:
    """Take, renew, release, and their refusals, pipelined with an infer and
    a relayed request: each answered in order, exactly as aiohttp's routes
    answered them."""
    with Conn(served.socket_path) as c:
        c.send(post_json("/v1/leases", {"model": "echo", "ttl": 30, "holder": "front-test"}))
        status, headers, body = c.answer()
        assert status == 200 and headers["content-type"].startswith("application/json"), body
        lease = json.loads(body)
        assert Path(lease["path"]).is_dir() and lease["expires_at"] > time.time()
        c.send(post_json(f"/v1/leases/{lease['lease']}/renew", {"ttl": 60}) + infer_request([7])
               + get("/v2/health/live"))
        status, _, body = c.answer()
        assert status == 200 and json.loads(body)["expires_at"] > lease["expires_at"]
        assert echoed(c.answer()) == [7]
        assert c.answer()[0] == 200
        c.send(f"DELETE /v1/leases/{lease['lease']} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert c.answer()[:1] == (200,)
        for request, status, fragment in (
            (post_json("/v1/leases", {"ttl": 30}), 400, "'model' must be a non-empty string"),
            (b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{nope", 400,
             "request body is not valid JSON"),
            (post_json("/v1/leases", {"model": "no-such-model"}), 404, "no-such-model"),
            (f"DELETE /v1/leases/{lease['lease']} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), 404, lease["lease"]),
            (get("/v1/leases"), 404, "no such endpoint: GET /v1/leases"),   # aiohttp answers, through the relay
        ):
            c.send(request)
            got, _, body = c.answer()
            assert got == status and fragment in body.decode(), (request[:40], got, body)


def test_a_head_request_keeps_its_connection(served: DaemonProcess) -> None:
    """A HEAD answer says Content-Length but has no body: the relay must
    not wait for one, and the connection goes on."""
    with Conn(served.socket_path) as c:
        c.send(b"HEAD /v2/models/echo HTTP/1.1\r\nHost: x\r\n\r\n")
        while b"\r\n\r\n" not in c.buf:
            assert c._fill()
        head, c.buf = c.buf.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200") and b"close" not in head.lower()
        c.send(infer_request([9]))
        assert echoed(c.answer()) == [9]


def test_sigterm_lets_an_infer_the_front_answers_finish(short_tmp: Path) -> None:
    from test_shm import slow_carton

    d = DaemonProcess(short_tmp / "root", listen=None).start()
    try:
        _load(d, "slow", slow_carton(short_tmp / "slow"))
        with Conn(d.socket_path) as c:
            c.send(infer_request([1.5, 2.5], name="slow"))   # the model takes 1 s
            assert wait_for(lambda: in_flight(d, "slow") == 1)
            d.proc.send_signal(signal.SIGTERM)
            assert echoed(c.answer()) == [3.0, 5.0]
        assert d.proc.wait(30) == 0
    finally:
        d.stop()
    assert wait_for(lambda: not runner_pids(short_tmp / "root"), 10)
