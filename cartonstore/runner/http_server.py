"""The runner's HTTP/1.1 server: one thread per connection on blocking
sockets, each request answered in the thread that read it.

Why not aiohttp, what runners used before: one-row requests to a small
ONNX model took 0.40 ms from the daemon's runner client against 0.22 ms
here (2-core VM, p50). aiohttp parses a request on the event loop, hands the
model call to a worker thread and the answer back to the loop: two thread
wake-ups and its own request and response objects per request. Here the
thread that reads a request decodes it, runs the model and writes the
answer, and a model that lets go of the GIL (onnxruntime, torch) runs on
as many cores as there are requests (rest.py bounds it: max_concurrency).

What it serves is what its one client, the daemon (or someone testing a
runner by hand), sends: Content-Length or chunked bodies, keep-alive,
pipelined requests answered in order, HTTP/1.0 (one request). Heads and
chunked bodies are read by cartonstore.v2.http1 (llhttp), as the daemon's are.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from cartonstore.v2.http1 import (
    BadChunks,
    RequestHead,
    parse_request_head,
    response_head,
    take_head,
)
from cartonstore.v2.http1_faults import BadHead

from .protocol import RUNNER_IDLE_LIMIT

MAX_CONNECTIONS = 512      # threads at once; past it a connection gets 503 (runners.max_processes counts threads too)
SOCKET_BUFFER = 4 << 20    # a 4 MiB answer leaves in one send
RECV_CHUNK = 1 << 16
DRAIN_POLL = 0.05          # while draining, connections that arrive are answered 503 this often
DRAIN_JOIN = 5.0           # seconds to wait for the connections' threads once their sockets are shut down
_IOV_MAX = 1024            # buffers per sendmsg (Linux's UIO_MAXIOV)
_TIMEVAL = struct.pack("@ll", int(RUNNER_IDLE_LIMIT), 0)   # an idle connection is closed after this long


@dataclass
class Request:
    method: str
    path: str                 # without the query, still percent-encoded
    headers: dict[str, str]   # lower-case names
    body: memoryview          # writable: arrays decoded from it may be modified in place by the model
    started_ns: int = 0       # time.monotonic_ns() when its head was read


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    parts: Sequence[bytes | bytearray | memoryview] = ()
    # a body written piece by piece as it is made, framed by closing the connection
    stream: Iterator[Sequence[bytes | bytearray | memoryview]] | None = None


Handler = Callable[[Request], Response]


class _Closed(Exception):
    """The peer closed (or reset) the connection, or it idled past RUNNER_IDLE_LIMIT."""


class _Reader:
    """Bytes of one connection: heads through a buffer, bodies received in place."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.pending = bytearray()

    def _recv(self) -> None:
        try:
            data = self.conn.recv(RECV_CHUNK)
        except OSError:   # reset, or idle past RUNNER_IDLE_LIMIT (EAGAIN)
            raise _Closed() from None
        if not data:
            raise _Closed()
        self.pending += data

    def head(self) -> bytes:
        while (head := take_head(self.pending)) is None:
            self._recv()
        return head

    def exactly(self, size: int) -> bytearray:
        """``size`` bytes in one bytearray: what is pending, the rest received straight into it."""
        try:
            out = bytearray(size)
        except MemoryError:   # a Content-Length this host cannot hold
            raise BadHead(413, f"a body of {size} bytes does not fit in this runner's memory") from None
        have = min(size, len(self.pending))
        out[:have] = self.pending[:have]
        del self.pending[:have]
        view = memoryview(out)
        while have < size:
            try:
                got = self.conn.recv_into(view[have:])
            except OSError:
                raise _Closed() from None
            if not got:
                raise _Closed()
            have += got
        return out

    def body(self, head: RequestHead) -> bytearray:
        length = head.content_length()
        if length is not None:
            return self.exactly(length)
        decoder = head.chunked_body()
        try:
            while (taken := decoder.feed(self.pending)) is None:
                self.pending.clear()
                self._recv()
        except BadChunks as exc:
            raise BadHead(400, str(exc)) from None
        except MemoryError:   # each piece fitted, their sum does not
            raise BadHead(413, f"a body of {len(decoder.body)} bytes and more does not fit in this runner's "
                               "memory") from None
        del self.pending[:taken]
        return decoder.body


def _send(conn: socket.socket, *parts: bytes | bytearray | memoryview) -> None:
    """send_all, a connection that fails as _Closed."""
    try:
        send_all(conn, parts)
    except OSError:
        raise _Closed() from None


def send_all(conn: socket.socket, parts: Sequence[bytes | bytearray | memoryview]) -> None:
    """Every byte of ``parts``, in order, without joining them (sendmsg
    takes them as they are; a big tensor is never copied)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        sent = conn.sendmsg(views[:_IOV_MAX])
        while views and sent >= len(views[0]):
            sent -= len(views.pop(0))
        if sent:
            views[0] = views[0][sent:]


def _send_stream(conn: socket.socket, response: Response) -> None:
    """A streamed answer: its head, then each piece as its iterator makes
    it (a reader that stops reading blocks it here), then the end of the
    connection; the iterator is closed however it ends."""
    stream = response.stream
    assert stream is not None
    try:
        _send(conn, response_head(response.status, dict(response.headers), close=True))
        for parts in stream:
            _send(conn, *parts)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def error_response(status: int, message: str) -> Response:
    """An answer of ``{"error": message}``, as every v2 server's errors are."""
    return Response(status, {"Content-Type": "application/json"}, [json.dumps({"error": message}).encode()])


def _closing_error(status: int, message: str) -> bytes:
    """An error answer for a connection that ends after it."""
    (body,) = error_response(status, message).parts
    return response_head(status, {"Content-Type": "application/json", "Content-Length": str(len(body))},
                         close=True) + body


class HttpServer:
    """Serves ``handler`` on a listening socket until ``stop``; ``drain``
    then waits for the requests being answered and closes every connection."""

    def __init__(self, listener: socket.socket, handler: Handler) -> None:
        self.listener = listener
        self.handler = handler
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Condition(threading.Lock())
        self._connections: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._in_flight = 0
        self._stopping = False   # stop() was called: new requests get 503 and their connection closes

    def stop(self) -> None:
        """Stop taking requests: serve() returns, and each request read from
        here on is answered 503. Safe from a signal handler (which runs in the
        main thread, as drain() does: the fd it writes is never a closed one)."""
        self._stopping = True
        if self._wake_w < 0:
            return
        try:
            os.write(self._wake_w, b"x")
        except OSError:   # already woken (the pipe is full)
            pass

    def serve(self) -> None:
        """Accept connections until ``stop``; each gets a thread of its own.

        In the main thread, a signal also wakes the poll (the wake pipe is
        the interpreter's wakeup fd while it runs): the kernel may hand a
        process's SIGTERM to any of its threads (a connection's thread, when
        the main one already has a signal pending), and Python runs the
        handler only once the main thread runs again, which in poll() with
        nothing arriving would be never."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False) if main else -1
        try:
            self._accept_until_woken()
        finally:
            if main:
                signal.set_wakeup_fd(previous)

    def _accept_until_woken(self) -> None:
        listening = self.listener.fileno()
        poller = select.poll()
        poller.register(listening, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        self.listener.setblocking(False)
        while True:
            ready = dict(poller.poll())
            if self._wake_r in ready and self._woken_to_stop():
                return
            if listening not in ready:
                continue
            if ready[listening] & (select.POLLNVAL | select.POLLERR):   # closed under us: nothing more to accept
                print("cartonstore runner: the listening socket is gone; stopping", file=sys.stderr, flush=True)
                return
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:   # out of fds, for one: the connection waits in the backlog
                print(f"cartonstore runner: accept failed: {exc}", file=sys.stderr, flush=True)
                time.sleep(0.1)
                continue
            self._start(conn)

    def _woken_to_stop(self) -> bool:
        """What woke the poll: stop() (it writes "x"), or a signal, which
        the interpreter writes as its number. SIGTERM and SIGINT stop the
        server even before their handler (stop()) has run; other signals (a
        model's own handlers) do not."""
        try:
            said = os.read(self._wake_r, 4096)
        except BlockingIOError:
            said = b""
        return self._stopping or any(byte in said for byte in (ord("x"), signal.SIGTERM, signal.SIGINT))

    def _start(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        with self._lock:
            full = len(self._connections) >= MAX_CONNECTIONS
            if not full:
                self._connections.add(conn)
        if not full:
            thread = threading.Thread(target=self._connection, args=(conn,), name="runner-conn", daemon=True)
            try:
                with self._lock:   # a thread that served its connection is dropped here, or joined by drain()
                    self._threads = {t for t in self._threads if t.is_alive()}
                    self._threads.add(thread)
                thread.start()
                return
            except RuntimeError:   # no thread to be had (pids.max, RLIMIT_NPROC)
                with self._lock:
                    self._connections.discard(conn)
                    self._threads.discard(thread)
        try:
            conn.sendall(_closing_error(503, f"the runner has {len(self._connections)} connections open and can "
                                              "take no more (threads count against runners.max_processes); "
                                              "retry later"))
        except OSError:
            pass
        conn.close()

    def _connection(self, conn: socket.socket) -> None:
        reader = _Reader(conn)
        try:   # from here on, whatever happens, the finally closes it and frees its place
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                conn.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            # The kernel's timeouts, not Python's settimeout(), which polls before every recv (about 20 us a request)
            for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
                conn.setsockopt(socket.SOL_SOCKET, option, _TIMEVAL)
            while self._one_request(conn, reader):
                pass
        except _Closed:
            pass
        except BadHead as exc:
            try:
                conn.sendall(_closing_error(exc.status, str(exc)))
            except OSError:
                pass
        except Exception:  # noqa: BLE001 - a bug: said on stderr, this connection ends, the runner serves on
            traceback.print_exc(file=sys.stderr)
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _one_request(self, conn: socket.socket, reader: _Reader) -> bool:
        """Read, answer; whether the connection goes on."""
        head = parse_request_head(reader.head())
        started = time.monotonic_ns()
        with self._lock:
            counted = not self._stopping
            if counted:
                self._in_flight += 1
        if not counted:
            _send(conn, _closing_error(503, "the runner is stopping"))
            return False
        try:
            if head.version != "1.0" and "100-continue" in head.headers.get("expect", "").lower():
                _send(conn, b"HTTP/1.1 100 Continue\r\n\r\n")
            body = memoryview(reader.body(head))
            # HEAD is GET without the body, as aiohttp's GET routes answered it
            method = "GET" if head.method == "HEAD" else head.method
            try:
                response = self.handler(Request(method, head.path, head.headers, body, started))
                size = sum(memoryview(p).nbytes for p in response.parts)
            except Exception as exc:  # noqa: BLE001 - a bug in a handler answers 500, the runner serves on
                traceback.print_exc(file=sys.stderr)
                response = error_response(500, f"{type(exc).__name__}: {exc}")
                size = sum(len(p) for p in response.parts)
            if response.stream is not None:
                _send_stream(conn, response)
                return False
            keep = head.keep_alive
            headers = {**response.headers, "Content-Length": str(size)}
            parts = () if head.method == "HEAD" else response.parts
            _send(conn, response_head(response.status, headers, close=not keep), *parts)
            return keep
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._lock.notify_all()

    def drain(self) -> None:
        """Wait until no request is being answered, then close every
        connection and wait for their threads to end (a thread that ran a
        model and ends while the process exits may race the framework's own
        teardown: torch aborted so), then close the wake pipe."""
        self._stopping = True
        while True:
            with self._lock:
                if self._lock.wait_for(lambda: self._in_flight == 0, DRAIN_POLL):
                    connections, threads = list(self._connections), list(self._threads)
                    break
            self._refuse_arrivals()
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + DRAIN_JOIN   # one wait for all: not DRAIN_JOIN per thread
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._refuse_arrivals()
        wake_w, self._wake_w = self._wake_w, -1
        os.close(self._wake_r)
        os.close(wake_w)

    def _refuse_arrivals(self) -> None:
        """Answer the connections waiting to be accepted 503, as a stopping server does."""
        self.listener.setblocking(False)
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:   # none waiting (the listener is non-blocking once served), or it is closed
                return
            with conn:
                conn.setblocking(True)
                try:
                    conn.sendall(_closing_error(503, "the runner is stopping"))
                except OSError:
                    pass
