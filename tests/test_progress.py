"""Progress output: a bar on a terminal, plain lines otherwise, JSON for scripts."""

from __future__ import annotations

import io
import json

from cartonstore import progress as progress_mod
from cartonstore.progress import Progress


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_picks_plain_off_a_terminal_and_bar_on_one() -> None:
    assert Progress("auto", io.StringIO()).mode == "plain"
    bar = Progress("auto", FakeTTY())
    assert bar.mode == "bar"
    bar.bytes(3 << 20)
    bar.close({"requests": 1})
    assert "MiB" in bar.stream.getvalue() or "M" in bar.stream.getvalue()


def test_plain_lines_are_rate_limited(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(progress_mod, "PLAIN_INTERVAL", 0.0)
    out = io.StringIO()
    p = Progress("plain", out)
    p.event({"event": "carton", "url": "http://h/m.carton"})
    p.bytes(1 << 20)
    p.close({"requests": 2})
    lines = out.getvalue().splitlines()
    assert lines[0] == "reading http://h/m.carton"
    assert lines[1].startswith("fetched 1.0 MiB")
    assert lines[-1].startswith("transferred 1.0 MiB")


def test_json_events_are_one_object_per_line() -> None:
    out = io.StringIO()
    p = Progress("json", out)
    p.event({"event": "carton", "url": "http://h/m.carton"})
    p.bytes(10)
    p.close({"requests": 3})
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert events[0] == {"event": "carton", "url": "http://h/m.carton"}
    assert events[-1]["event"] == "done" and events[-1]["bytes"] == 10 and events[-1]["requests"] == 3


def test_none_prints_nothing() -> None:
    out = io.StringIO()
    p = Progress("none", out)
    p.bytes(10)
    p.event({"event": "carton", "url": "x"})
    p.close({"requests": 1})
    assert out.getvalue() == ""
