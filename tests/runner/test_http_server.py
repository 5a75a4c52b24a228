"""The runner's HTTP/1.1 server (runner/http_server.py) on a real Unix
socket, with raw clients: keep-alive and pipelining, chunked and
100-continue bodies, HTTP/1.0, heads it refuses, handlers that fail,
clients that go away, the connection limit, and draining."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.daemonkit import wait_for

from cartonstore.runner import http_server
from cartonstore.runner.http_server import HttpServer, Request, Response
from cartonstore.v2.http1 import MAX_HEAD

SLEEPING = threading.Event()   # set as a /sleep request starts its wait


def echo(request: Request) -> Response:
    """Answers with what it got; ?sleep=S waits first; /raise raises."""
    if request.path == "/raise":
        raise KeyError("asked to raise")
    if request.path == "/sleep":
        SLEEPING.set()
        time.sleep(float(bytes(request.body)))
    if request.path == "/bad-parts":
        return Response(200, {}, [123])   # type: ignore[list-item]  # not a buffer: a handler's bug
    if request.path == "/double-in-place":   # the body is writable
        request.body[:] = bytes(b * 2 % 256 for b in request.body)
    head = f"{request.method} {request.path} {len(request.body)}\n".encode()
    return Response(200, {"Content-Type": "text/plain"}, [head, request.body])


class Running:
    def __init__(self, path: Path) -> None:
        self.path = path
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(path))
        listener.listen(64)
        self.listener = listener
        self.server = HttpServer(listener, echo)
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()

    def connect(self) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX)
        conn.settimeout(10)
        conn.connect(str(self.path))
        return conn

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(10)
        self.server.drain()


def assert_no_connection_thread_left() -> None:
    """drain() returns once every connection's thread has ended (none may be
    ending while the process exits)."""
    assert not any(t.name == "runner-conn" for t in threading.enumerate()), "a connection's thread outlived drain()"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    r = Running(tmp_path / "s.sock")
    try:
        yield r
    finally:
        r.stop()
        r.listener.close()
    assert_no_connection_thread_left()


def read_answer(conn: socket.socket, pending: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One answer from ``conn`` (what follows it stays in ``pending``)."""
    while b"\r\n\r\n" not in pending:
        data = conn.recv(65536)
        if not data:
            raise ConnectionError("closed before an answer")
        pending += data
    end = pending.index(b"\r\n\r\n")
    lines = pending[:end].decode("latin-1").split("\r\n")
    del pending[:end + 4]
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    size = int(headers.get("content-length", "0"))
    while len(pending) < size:
        data = conn.recv(65536)
        if not data:
            raise ConnectionError("closed mid-answer")
        pending += data
    body = bytes(pending[:size])
    del pending[:size]
    return int(lines[0].split(" ")[1]), headers, body


def request(method: str, path: str, body: bytes = b"", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: r\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def closed(conn: socket.socket) -> bool:
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


def test_keep_alive_and_pipelined_requests_are_answered_in_order(running: Running) -> None:
    conn, pending = running.connect(), bytearray()
    for i in range(3):
        conn.sendall(request("POST", f"/one{i}", b"x" * i))
        assert read_answer(conn, pending) == (200, {"content-type": "text/plain", "content-length": str(13 + i)},
                                              f"POST /one{i} {i}\n".encode() + b"x" * i)
    conn.sendall(request("POST", "/a", b"AA") + request("GET", "/b") + request("POST", "/c", b"C"))
    assert [read_answer(conn, pending)[2] for _ in range(3)] == [b"POST /a 2\nAA", b"GET /b 0\n", b"POST /c 1\nC"]
    conn.close()


def test_the_body_is_received_into_a_writable_buffer(running: Running) -> None:
    conn, pending = running.connect(), bytearray()
    conn.sendall(request("POST", "/double-in-place", bytes([1, 2, 3])))
    assert read_answer(conn, pending)[2] == b"POST /double-in-place 3\n" + bytes([2, 4, 6])
    conn.close()


def test_a_big_body_and_answer_cross_whole(running: Running) -> None:
    body = bytes(range(256)) * (96 * 1024)   # 24 MiB: many partial sends each way
    conn, pending = running.connect(), bytearray()
    sender = threading.Thread(target=conn.sendall, args=(request("POST", "/big", body),))
    sender.start()
    status, _, answer = read_answer(conn, pending)
    sender.join()
    assert status == 200 and answer == f"POST /big {len(body)}\n".encode() + body
    conn.close()


def test_chunked_and_100_continue_bodies(running: Running) -> None:
    conn, pending = running.connect(), bytearray()
    conn.sendall(b"POST /ch HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nTrailer: x\r\n\r\n")
    assert read_answer(conn, pending)[2] == b"POST /ch 5\nabcde"
    conn.sendall(b"POST /e HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert read_answer(conn, pending)[0] == 100
    conn.sendall(b"ok")
    assert read_answer(conn, pending)[2] == b"POST /e 2\nok"
    conn.close()
    old, pending = running.connect(), bytearray()   # HTTP/1.0 has no 100 Continue (RFC 9110 10.1.1)
    old.sendall(b"POST /e HTTP/1.0\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nok")
    assert read_answer(old, pending)[:3:2] == (200, b"POST /e 2\nok")
    old.close()


def test_head_is_get_without_the_body_and_empty_lines_between_requests_are_skipped(running: Running) -> None:
    conn = running.connect()
    conn.sendall(b"HEAD /h HTTP/1.1\r\nHost: r\r\n\r\n" + b"\r\n\r\n" + request("GET", "/after"))
    data = bytearray()
    while data.count(b"\r\n\r\n") < 2:
        data += conn.recv(65536)
    first = data.index(b"\r\n\r\n") + 4
    head, rest = bytes(data[:first]).decode(), data[first:]
    assert head.startswith("HTTP/1.1 200 ") and f"Content-Length: {len(b'GET /h 0')+1}\r\n" in head
    assert rest.startswith(b"HTTP/1.1 200 OK\r\n")   # no body came between the two
    assert read_answer(conn, rest)[2] == b"GET /after 0\n"
    conn.close()


def test_http_1_0_and_connection_close_end_the_connection_after_one_answer(running: Running) -> None:
    for head in (b"GET /x HTTP/1.0\r\n\r\n", b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n"):
        conn, pending = running.connect(), bytearray()
        conn.sendall(head + request("GET", "/never"))
        status, headers, body = read_answer(conn, pending)
        assert (status, headers.get("connection"), body) == (200, "close", b"GET /x 0\n")
        assert pending == b"" and closed(conn)
        conn.close()


@pytest.mark.parametrize(("sent", "status", "named"), [
    (b"NOT HTTP\r\n\r\n", 400, "bad request line"),
    (b"GET / HTTP/1.1\r\nbad header\r\n\r\n", 400, "bad header line"),
    (b"POST / HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 400, "Content-Length is not a length"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "Transfer-Encoding 'gzip' is not supported"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "bad chunk size"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n", 400, "bad chunk size (Invalid character"),
    (b"POST / HTTP/1.1\r\nContent-Length: 999999999999999999\r\n\r\n", 413, "does not fit in this runner's memory"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\n", 400,
     "bad chunk size (Chunk size overflow)"),   # past 2**64 - 1
    (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
     "Content-Length and Transfer-Encoding together"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", 400, "chunk not followed by CRLF"),
    (b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD + 10), 431, "request head longer than"),
])
def test_a_head_it_refuses_is_answered_by_name_and_the_connection_closed(running: Running, sent: bytes, status: int,
                                                                          named: str) -> None:
    conn, pending = running.connect(), bytearray()
    conn.sendall(sent)
    got, headers, body = read_answer(conn, pending)
    assert got == status and named in json.loads(body)["error"] and headers["connection"] == "close"
    assert closed(conn)
    conn.close()
    other, pending = running.connect(), bytearray()   # the server serves on
    other.sendall(request("GET", "/fine"))
    assert read_answer(other, pending)[0] == 200
    other.close()


def test_a_handler_that_raises_answers_500_and_the_connection_goes_on(running: Running) -> None:
    conn, pending = running.connect(), bytearray()
    conn.sendall(request("GET", "/raise"))
    status, _, body = read_answer(conn, pending)
    assert status == 500 and json.loads(body) == {"error": "KeyError: 'asked to raise'"}
    conn.sendall(request("GET", "/bad-parts"))
    status, _, body = read_answer(conn, pending)
    assert status == 500 and json.loads(body)["error"].startswith("TypeError")
    conn.sendall(request("GET", "/after"))
    assert read_answer(conn, pending)[2] == b"GET /after 0\n"
    conn.close()


def test_a_client_gone_mid_body_or_mid_head_leaves_the_server_serving(running: Running) -> None:
    for partial in (b"POST /x HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc", b"GET /x HTT",
                    b"POST /x HTTP/1.1\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n"):
        conn = running.connect()
        conn.sendall(partial)
        conn.close()
    conn, pending = running.connect(), bytearray()
    conn.sendall(request("GET", "/fine"))
    assert read_answer(conn, pending)[0] == 200
    conn.close()


def test_past_the_connection_limit_a_connection_is_answered_503(running: Running,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "MAX_CONNECTIONS", 2)
    held = [running.connect() for _ in range(2)]
    for conn in held:   # served: each has its thread
        pending = bytearray()
        conn.sendall(request("GET", "/held"))
        assert read_answer(conn, pending)[0] == 200
    extra, pending = running.connect(), bytearray()
    status, _, body = read_answer(extra, pending)
    assert status == 503 and "has 2 connections open and can take no more" in json.loads(body)["error"]
    assert closed(extra)
    held[0].close()

    def served_again() -> bool:
        again, pending = running.connect(), bytearray()
        try:
            again.sendall(request("GET", "/again"))
            return read_answer(again, pending)[0] == 200
        except OSError:   # answered 503 and closed before the request went out: held[0]'s thread is still ending
            return False
        finally:
            again.close()
    assert wait_for(served_again, 5, 0.02)   # once one closes, a new connection is served
    held[1].close()


def test_drain_answers_the_request_in_flight_then_closes_idle_connections(tmp_path: Path) -> None:
    r = Running(tmp_path / "d.sock")
    idle, idle_pending = r.connect(), bytearray()
    idle.sendall(request("GET", "/warm"))
    assert read_answer(idle, idle_pending)[0] == 200
    busy, pending = r.connect(), bytearray()
    SLEEPING.clear()
    busy.sendall(request("POST", "/sleep", b"0.5"))
    assert SLEEPING.wait(5)
    late_answers: list[int] = []

    def arrive_while_draining() -> None:   # on an open connection, and on a new one
        assert wait_for(lambda: r.server._stopping, 5, 0.01)  # stop() was called
        idle.sendall(request("GET", "/late"))
        late_answers.append(read_answer(idle, idle_pending)[0])
        newcomer = r.connect()
        late_answers.append(read_answer(newcomer, bytearray())[0])
        newcomer.close()

    late = threading.Thread(target=arrive_while_draining)
    late.start()
    started = time.monotonic()
    r.stop()   # returns once the slow answer is written
    assert time.monotonic() - started >= 0.3
    late.join(5)
    assert read_answer(busy, pending)[::2] == (200, b"POST /sleep 3\n0.5")
    assert late_answers == [503, 503]
    assert closed(busy) and closed(idle)
    r.listener.close()
    busy.close()
    idle.close()
    assert_no_connection_thread_left()


def test_a_connection_idle_past_the_keep_alive_limit_is_closed(running: Running,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "_TIMEVAL", http_server.struct.pack("@ll", 0, 200_000))   # 0.2 s
    conn, pending = running.connect(), bytearray()
    conn.sendall(request("GET", "/once"))
    assert read_answer(conn, pending)[0] == 200
    started = time.monotonic()
    assert closed(conn)
    assert 0.15 < time.monotonic() - started < 5
    conn.close()


def test_a_connection_that_gets_no_thread_is_answered_503(running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """pids.max or RLIMIT_NPROC reached: Thread.start raises RuntimeError."""
    class NoThread(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(http_server.threading, "Thread", NoThread)
    conn, pending = running.connect(), bytearray()
    status, _, body = read_answer(conn, pending)
    assert status == 503 and "can take no more" in json.loads(body)["error"]
    assert closed(conn)
    conn.close()
    monkeypatch.undo()
    again, pending = running.connect(), bytearray()
    again.sendall(request("GET", "/after"))
    assert read_answer(again, pending)[0] == 200
    again.close()


# A server in a process's main thread, as a runner runs it: SIGTERM stops it (its handler), SIGUSR1 (a model's
# own handler) does not.
MAIN_THREAD_SERVER = r'''
import signal, socket, sys
from cartonstore.runner.http_server import HttpServer, Response

listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen(16)
server = HttpServer(listener, lambda request: Response(200, {}, [b"ok"]))
signal.signal(signal.SIGTERM, lambda *_: server.stop())
signal.signal(signal.SIGUSR1, lambda *_: None)
print("ready", flush=True)
server.serve()
server.drain()
print("stopped", flush=True)
'''


def test_a_signal_the_model_handles_does_not_stop_a_main_thread_server(tmp_path: Path) -> None:
    """What wakes the poll now (the wakeup fd) must tell a stop from any
    other signal: a model's own SIGUSR1 handler leaves the server serving."""
    import signal
    import subprocess
    import sys

    path = tmp_path / "m.sock"
    proc = subprocess.Popen([sys.executable, "-c", MAIN_THREAD_SERVER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        for _ in range(3):
            proc.send_signal(signal.SIGUSR1)
            time.sleep(0.05)   # apart: three signals handled, not one left pending
        conn, pending = socket.socket(socket.AF_UNIX), bytearray()
        conn.connect(str(path))
        conn.sendall(request("GET", "/after-usr1"))
        assert read_answer(conn, pending) == (200, {"content-length": "2"}, b"ok")
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0 and proc.stdout.read() == "stopped\n"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
