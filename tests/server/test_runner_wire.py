"""The lean HTTP/1.1 client the daemon uses to talk to its runners
(cartonstore.server.runner_processes.wire), against a real Unix-socket server that
answers with canned bytes: every framing a runner may use, and the ways a
runner may break HTTP."""

from __future__ import annotations

import array
import asyncio
import socket
import threading
from pathlib import Path

import pytest

from cartonstore.errors import InvalidInput
from cartonstore.server.runner_processes.wire import BadResponse, RunnerClient, Unsent

CLOSE = b"<close>"


class CannedServer:
    """Answers request i (counted over all connections) with answers[i]; a
    None answer closes the connection without a word, so does an answer
    ending in CLOSE after it is sent. Records each request."""

    def __init__(self, answers: list[bytes | None], *, close_after: bool = False) -> None:
        self.answers = answers
        self.close_after = close_after
        self.requests: list[bytes] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers[len(self.requests) - 1]
                if answer is None:
                    break
                writer.write(answer.removesuffix(CLOSE))
                await writer.drain()
                if self.close_after or answer.endswith(CLOSE):
                    break
        except asyncio.IncompleteReadError:
            pass
        writer.close()


def talk(short_tmp: Path, server: CannedServer, *calls: tuple) -> list:
    """Run the calls (method, path, headers, body) in order on one client;
    each result is the answer or the exception raised."""
    async def go() -> list:
        sock = str(short_tmp / "s.sock")
        srv = await asyncio.start_unix_server(server.handle, sock)
        client = RunnerClient(sock)
        results: list = []
        try:
            for call in calls:
                try:
                    results.append(await client.request(*call))
                except (BadResponse, InvalidInput, OSError) as e:
                    results.append(e)
                await asyncio.sleep(0.02)   # let a server-side close arrive
        finally:
            client.close()
            srv.close()
            await srv.wait_closed()
        return results

    return asyncio.run(asyncio.wait_for(go(), 20))


OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
POST = ("POST", "/v2/models/m/infer", {"Inference-Header-Content-Length": "3"}, [b"abc", memoryview(b"defg")])


def test_request_bytes_and_keep_alive(short_tmp: Path) -> None:
    server = CannedServer([OK, OK, OK])
    results = talk(short_tmp, server, POST, POST, ("GET", "/v2/health/ready", {}))
    assert results == [(200, {"content-type": "text/plain", "content-length": "2"}, b"ok")] * 3
    assert server.requests[0] == (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: runner\r\nContent-Length: 7\r\n"
                                  b"Inference-Header-Content-Length: 3\r\n\r\nabcdefg")
    assert server.requests[2].startswith(b"GET /v2/health/ready HTTP/1.1\r\n")
    assert server.connections == 1


def test_memoryview_of_wide_items_is_sent_as_bytes(short_tmp: Path) -> None:
    floats = array.array("f", [1.0, 2.0, 3.0])
    server = CannedServer([OK])
    talk(short_tmp, server, ("POST", "/x", {}, [memoryview(floats)]))
    assert server.requests[0].endswith(b"Content-Length: 12\r\n\r\n" + floats.tobytes())


def test_response_framings(short_tmp: Path) -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"3;ext=1\r\nabc\r\n0A\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n")
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" + OK
    no_content = b"HTTP/1.1 204 No Content\r\n\r\n"
    until_close = b"HTTP/1.0 500 Oops\r\n\r\nall of this" + CLOSE
    server = CannedServer([chunked, interim, no_content, until_close, OK])
    results = talk(short_tmp, server, POST, POST, POST, POST, POST)
    assert results[0][0] == 200 and results[0][2] == b"abc0123456789"
    assert results[1] == (200, {"content-type": "text/plain", "content-length": "2"}, b"ok")
    assert results[2] == (204, {}, b"")
    assert results[3] == (500, {}, b"all of this")
    assert results[4][2] == b"ok"
    assert server.connections == 2   # the close-framed answer ended its connection


def test_connection_closed_by_server_between_requests_is_not_reused(short_tmp: Path) -> None:
    server = CannedServer([OK, OK], close_after=True)
    results = talk(short_tmp, server, POST, POST)
    assert [r[2] for r in results] == [b"ok", b"ok"]
    assert server.connections == 2


@pytest.mark.parametrize("answer, message", [
    (b"\x00\xffNOT HTTP\r\n\r\n", "not an HTTP response"),
    (b"HTTP/1.1 2000 Huge\r\n\r\n", "not an HTTP response"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad response header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "closed the connection mid-answer"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n", "bad chunk size (Invalid character"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY", "chunk not followed by CRLF"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n" + b"a" * 0x10001,
     "over the limit of 65536 bytes"),   # 2**64 - 1: refused once its bytes pass the limit
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\n", "bad chunk size (Chunk size"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", "over its limit"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 65537\r\n\r\n", "Content-Length 65537, over its limit of 64.0 KiB"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"8000\r\n" + b"a" * 0x8000 + b"\r\n" * 1
     + b"8001\r\n" + b"a" * 0x8001 + b"\r\n0\r\n\r\n", "chunks of more than 64.0 KiB in all"),
    (b"HTTP/1.1 200 OK\r\n\r\n" + b"a" * 70000 + CLOSE, "more than 64.0 KiB (its limit)"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1\r\na\r\n" * 65 + b"0\r\n\r\n",
     "answered in more than 64 chunks"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", "101 header lines, over the 100"),
    (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n", "response head longer than 65536 bytes"),
    (b"HTTP/1.1 100 Continue\r\n\r\n" * 9 + OK, "more than 8 interim (1xx) answers"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + b"X-T: t\r\n" * 101 + b"\r\n",
     "more than 100 trailer lines"),
    (None, "closed the connection without answering"),
])
def test_broken_answers(short_tmp: Path, answer: bytes | None, message: str) -> None:
    server = CannedServer([answer, OK], close_after=True)
    broken, after = talk(short_tmp, server, POST, POST)
    assert isinstance(broken, BadResponse) and message in str(broken)
    assert after[2] == b"ok"   # a fresh connection works again


def test_bad_request_inputs(short_tmp: Path) -> None:
    server = CannedServer([OK])
    injected, no_slash, _fine = talk(short_tmp, server, ("POST", "/x", {"X-Evil": "a\r\nHost: b"}, [b""]),
                                    ("POST", "x", {}, [b""]), ("POST", "/m a", {}, [b""]))
    assert isinstance(injected, InvalidInput) and "X-Evil" in str(injected)
    assert isinstance(no_slash, InvalidInput) and "must start with '/'" in str(no_slash)
    assert server.requests[0].startswith(b"POST /m%20a HTTP/1.1\r\n")


def test_unreachable_socket(short_tmp: Path) -> None:
    async def go() -> None:
        # not a byte went out: the request may go to another runner
        with pytest.raises(Unsent, match="^cannot connect: No such file or directory$") as caught:
            await RunnerClient(str(short_tmp / "nobody.sock")).request("GET", "/", {})
        assert isinstance(caught.value.__cause__, FileNotFoundError)

    asyncio.run(go())


def test_a_kept_connection_whose_server_is_gone_sends_nothing(short_tmp: Path) -> None:
    """The server answered keeping the connection, then went away before the
    client saw it close: the next request's first write fails (EPIPE), so
    it is Unsent, not one byte of it having reached a server."""
    path = str(short_tmp / "gone.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()

    def serve_once() -> None:
        conn, _ = listener.accept()
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(65536)
        conn.sendall(OK)
        conn.close()
        listener.close()

    server = threading.Thread(target=serve_once)
    server.start()

    async def go() -> None:
        client = RunnerClient(path)
        try:
            assert (await client.request("GET", "/", {}))[0] == 200
            server.join()   # blocking the loop: the client has not seen the close when it sends again
            with pytest.raises(Unsent, match="^connection lost: the server is gone$"):
                await client.request("POST", "/v2/models/m/infer", {}, [b"abc"])
        finally:
            client.close()

    asyncio.run(asyncio.wait_for(go(), 20))


def stalled_answer(short_tmp: Path, head: bytes, limit: int, measure=lambda: 0) -> tuple[object, object, object]:
    """A server that answers with ``head`` (and what follows it), then
    holds the connection; the client is closed while it waits for the rest.
    (measure() before the request, measure() while it waits, the outcome)."""
    async def go() -> tuple[object, object, object]:
        got_head = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(head)
            await writer.drain()
            got_head.set()
            await asyncio.sleep(5)
            writer.close()

        sock = str(short_tmp / "s.sock")
        srv = await asyncio.start_unix_server(handle, sock)
        client = RunnerClient(sock)
        try:
            before = measure()
            pending = asyncio.ensure_future(client.request("POST", "/x", {}, limit=limit))
            await asyncio.wait([pending, asyncio.ensure_future(got_head.wait())],
                               return_when=asyncio.FIRST_COMPLETED)
            await asyncio.sleep(0.1)   # nothing to wait for: the time a client that sized its buffer by the head would take
            during = measure()
            client.close()
            try:
                return before, during, await pending
            except Exception as e:  # noqa: BLE001 - the outcome under test
                return before, during, e
        finally:
            srv.close()

    return asyncio.run(go())


def test_an_answer_cut_short_by_close_is_an_error_not_zero_padding(short_tmp: Path) -> None:
    """The connection closed (the client closing it: a runner stopped) while
    a Content-Length body arrives: the half-received body must not come
    back as a whole answer padded with zero bytes."""
    _, _, outcome = stalled_answer(short_tmp, b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 10,
                                   1 << 20)
    assert isinstance(outcome, BadResponse) and "mid-answer" in str(outcome), outcome


def test_a_claimed_length_costs_the_bytes_sent_not_the_bytes_claimed(short_tmp: Path) -> None:
    """A runner that claims a body within the limit (512 MiB here) and sends
    one byte: the buffer waiting for the rest is committed as bytes land,
    so this process's resident memory does not grow by the claim."""
    def rss() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))

    before, during, outcome = stalled_answer(short_tmp, b"HTTP/1.1 200 OK\r\nContent-Length: 536870912\r\n\r\nx",
                                             1 << 30, rss)
    assert during - before < 64 << 20, f"resident memory grew by {(during - before) >> 20} MiB for a 1-byte answer"
    assert isinstance(outcome, BadResponse) and "mid-answer" in str(outcome), outcome


def test_a_claim_within_its_limit_that_no_memory_can_hold_is_a_bad_answer(short_tmp: Path) -> None:
    """A model declaring outputs of exabytes has a limit that big: its
    runner's claim of 2**60 bytes is refused as an answer, not a crash."""
    _, _, outcome = stalled_answer(short_tmp, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\nx" % (1 << 60), 1 << 62)
    assert isinstance(outcome, BadResponse) and outcome.answered, outcome
    assert f"answered a body of {1 << 60} bytes, which the daemon cannot hold" in str(outcome)


def test_a_big_answer_within_its_limit_arrives_whole(short_tmp: Path) -> None:
    big = bytes(range(256)) * 4096   # 1 MiB: received into uninitialised memory, every byte of it written
    server = CannedServer([b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big])

    async def go() -> tuple:
        sock = str(short_tmp / "s.sock")
        srv = await asyncio.start_unix_server(server.handle, sock)
        client = RunnerClient(sock)
        try:
            status, _, body = await client.request("POST", "/x", {}, limit=len(big))
            return status, bytes(body)
        finally:
            client.close()
            srv.close()

    assert asyncio.run(go()) == (200, big)
