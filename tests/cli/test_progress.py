"""Progress output: a bar on a terminal, plain lines otherwise, JSON for scripts;
read from the fetcher's counters a few times a second, never per chunk."""

from __future__ import annotations

import asyncio
import io
import json
import time

from kit.together import all_at_once

from cartonstore.cli import progress as progress_mod
from cartonstore.cli.progress import Progress
from cartonstore.errors import FetchError
from cartonstore.fetch.transfer.stats import Tally, TransferStats, retry_reason


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def counted(received: int, expected: int) -> TransferStats:
    stats = TransferStats()
    stats.expect(expected)
    stats.received(received)
    return stats


def test_auto_picks_plain_off_a_terminal_and_bar_on_one() -> None:
    assert Progress("auto", io.StringIO()).mode == "plain"
    bar = Progress("auto", FakeTTY())
    assert bar.mode == "bar"
    bar.watch(counted(3 << 20, 6 << 20))
    bar.tick()
    bar.close({"requests": 1})
    assert "3.00M/6.00M" in bar.stream.getvalue() and "50%" in bar.stream.getvalue()


def test_plain_lines_say_bytes_and_total() -> None:
    out = io.StringIO()
    p = Progress("plain", out)
    p.event({"event": "carton", "url": "http://h/m.carton"})
    p.watch(stats := counted(1 << 20, 2 << 20))
    p.tick()
    p.tick()  # nothing moved: nothing said
    stats.received(1 << 20)
    p.close({"requests": 2})
    lines = out.getvalue().splitlines()
    assert lines[0] == "reading http://h/m.carton"
    assert lines[1].startswith("fetched 1.0 MiB of 2.0 MiB (")
    assert lines[2].startswith("transferred 2.0 MiB in ") and len(lines) == 3


def test_json_events_are_one_object_per_line() -> None:
    out = io.StringIO()
    p = Progress("json", out)
    p.event({"event": "carton", "url": "http://h/m.carton"})
    p.watch(stats := counted(10, 20))
    p.tick()
    stats.received(15)  # more than expected: the total is not known after all
    p.tick()
    p.close({"requests": 3})
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert events[0] == {"event": "carton", "url": "http://h/m.carton"}
    assert events[1] == {"event": "progress", "bytes": 10, "total": 20}
    assert events[2] == {"event": "progress", "bytes": 25, "total": None}
    assert events[-1]["event"] == "done" and events[-1]["bytes"] == 25 and events[-1]["requests"] == 3


def test_none_prints_nothing() -> None:
    out = io.StringIO()
    p = Progress("none", out)
    p.watch(counted(10, 10))
    p.tick()
    p.event({"event": "carton", "url": "x"})
    p.event({"event": "retry", "url": "x", "message": "retry 1/2 in 0.1 s: timed out"})
    p.close({"requests": 1})
    assert out.getvalue() == ""


def test_updates_are_throttled_however_often_bytes_arrive(monkeypatch) -> None:
    monkeypatch.setattr(progress_mod, "JSON_INTERVAL", 0.1)
    out = io.StringIO()
    p = Progress("json", out)
    stats = TransferStats()

    async def transfer() -> float:
        p.watch(stats)
        started = time.monotonic()
        stats.expect(20_000)
        for _ in range(20_000):  # 20,000 chunks in about half a second
            stats.received(1)
            if _ % 100 == 0:
                await asyncio.sleep(0.0025)
        p.close({"requests": 1})
        return time.monotonic() - started

    seconds = asyncio.run(transfer())
    updates = [json.loads(line) for line in out.getvalue().splitlines()[:-1]]
    assert 2 <= len(updates) <= seconds / 0.1 + 1, (len(updates), seconds)
    assert all(u["event"] == "progress" and u["total"] == 20_000 for u in updates)


def test_retries_are_said_in_plain_and_bar_modes() -> None:
    event = {"event": "retry", "url": "h:1/m.carton", "message": "retry 2/3 in 1.0 s: connection refused"}
    for mode, stream in (("plain", io.StringIO()), ("bar", FakeTTY())):
        p = Progress(mode, stream)
        p.event(event)
        p.close()
        assert "retry 2/3 in 1.0 s: connection refused (h:1/m.carton)" in stream.getvalue()


def test_counters_are_exact_when_counted_from_many_threads() -> None:
    stats = TransferStats()

    def work() -> None:
        for _ in range(20_000):
            stats.received(3, "mirror")
            stats.expect(3)

    all_at_once([work] * 8)
    assert stats.progress() == (480_000, 480_000) and stats.source_bytes["mirror"] == 480_000


def test_a_tally_leaves_expected_equal_to_received_after_retries() -> None:
    stats = TransferStats()
    first = Tally(stats, 100)           # a response announced 100 bytes...
    first.add(40)                       # ...and broke off after 40
    assert stats.progress() == (40, 100)
    first.settle()
    second = Tally(stats, 60)           # the rest, resumed
    second.add(60)
    second.more(5)                      # and a body that ran on past what was needed
    second.add(5)
    second.settle()
    assert stats.progress() == (105, 105)


def test_retry_reasons_are_the_systems_words() -> None:
    def chained(cause: BaseException, message: str) -> FetchError:
        try:
            raise cause
        except BaseException as e:  # noqa: BLE001 - whatever is raised is the cause under test
            try:
                raise FetchError(message, subject="http://h:1/x") from e
            except FetchError as f:
                return f

    refused = chained(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)"),
                      "h:1/x: connection failed (Cannot connect to host h:1 ssl:default [Connect call failed])")
    assert retry_reason(refused, "http://h:1/x") == "connection refused"
    assert retry_reason(chained(TimeoutError(), "h:1/x: timed out"), "http://h:1/x") == "timed out"
    payload = chained(ValueError("Response payload is not completed"),
                      "http://h:1/x: body ended early or was malformed (Response payload is not completed)")
    assert retry_reason(payload, "http://h:1/x") == "body ended early or was malformed"
    status = FetchError("http://h:1/x: HTTP 503 Service Unavailable", subject="http://h:1/x", retryable=True)
    assert retry_reason(status, "http://h:1/x") == "HTTP 503 Service Unavailable"
