"""Showing transfers to a person or a script.

A bar (tqdm) on a terminal, plain lines when stderr is not a terminal, JSON
lines for scripts, or nothing. Always on stderr, so stdout keeps only the
result. The fetcher only counts (fetch.stats.TransferStats); a task on the
event loop reads the counts every interval and shows bytes received and the
total expected when they changed, so the data path never formats or writes
anything, however many requests run at once.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from cartonstore.format.units import format_size

if TYPE_CHECKING:
    import asyncio

    from tqdm import tqdm


MODES = ("auto", "bar", "plain", "json", "none")
# Seconds between updates: a few a second on a terminal and for scripts,
# one a second in a log.
BAR_INTERVAL = 0.25
JSON_INTERVAL = 0.5
PLAIN_INTERVAL = 1.0


class Counts(Protocol):
    retries: int

    def progress(self) -> tuple[int, int]: ...  # (bytes received, bytes expected)


class Progress:
    def __init__(self, mode: str = "auto", stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "plain"
        self.mode = mode
        self.interval = {"bar": BAR_INTERVAL, "json": JSON_INTERVAL}.get(mode, PLAIN_INTERVAL)
        self.started = time.monotonic()
        self.received = 0
        self.expected = 0
        self._counts: Counts | None = None
        self._shown = (0, 0)
        self._ticker: asyncio.Task[None] | None = None
        self._bar: tqdm[Any] | None = None
        self._label = "fetching"

    def watch(self, counts: Counts) -> None:
        """Show counts.progress() as it moves: every interval, by a task on
        the running event loop (without one, whenever tick() is called)."""
        self._counts = counts
        import asyncio  # imported here: `path` of a built model closes a Progress without any event loop

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self.mode != "none":
            self._ticker = loop.create_task(self._tick_forever())

    async def _tick_forever(self) -> None:
        import asyncio  # loaded already: this runs on its loop

        while True:
            await asyncio.sleep(self.interval)
            self.tick()

    def tick(self) -> None:
        """Read the counts; show them if they changed since last shown."""
        if self._counts is None:
            return
        self.received, self.expected = self._counts.progress()
        if (self.received, self.expected) == self._shown or self.mode == "none":
            return
        self._shown = (self.received, self.expected)
        total = self.total
        if self.mode == "json":
            self._json({"event": "progress", "bytes": self.received, "total": total})
        elif self.mode == "plain":
            of = f" of {format_size(total)}" if total is not None else ""
            rate = self.received / max(time.monotonic() - self.started, 1e-9)
            print(f"fetched {format_size(self.received)}{of} ({format_size(int(rate))}/s)", file=self.stream,
                  flush=True)
        elif self.mode == "bar":
            self._draw_bar(total)

    @property
    def total(self) -> int | None:
        """Bytes expected in all, when known (not yet when some body's length is not)."""
        return self.expected if self.expected and self.expected >= self.received else None

    def _draw_bar(self, total: int | None) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, file=self.stream,
                             desc=self._label, leave=False, dynamic_ncols=True, mininterval=0)
        if self._bar.total != total:
            self._bar.total = total
        self._bar.update(self.received - self._bar.n)

    def event(self, data: dict[str, Any]) -> None:
        kind = data.get("event")
        if self.mode == "json":
            self._json(data)
        elif kind == "name":  # a name moved or kept: said in every mode, it is not progress
            self._say(data["message"])
        elif self.mode == "none":
            return
        elif kind == "retry":
            self._say(f"{data['message']} ({data['url']})")
        elif self.mode == "plain" and kind == "carton":
            print(f"reading {data.get('url')}", file=self.stream, flush=True)
        elif self.mode == "bar" and data.get("url"):
            self._label = f"fetching {data['url']}"[:60]
            if self._bar is not None:
                self._bar.set_description_str(self._label)

    def close(self, summary: dict[str, Any] | None = None) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._counts is not None:
            self.received, self.expected = self._counts.progress()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        seconds = time.monotonic() - self.started
        if summary is not None and self.mode == "json":
            retries = {"retries": self._counts.retries} if self._counts is not None else {}
            self._json({"event": "done", "bytes": self.received, "total": self.total, "seconds": round(seconds, 3),
                        **retries, **summary})
        elif summary is not None and self.mode in ("plain", "bar") and self.received:
            rate = self.received / max(seconds, 1e-9)
            print(f"transferred {format_size(self.received)} in {seconds:.1f}s ({format_size(int(rate))}/s)",
                  file=self.stream, flush=True)

    def _say(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def _json(self, data: dict[str, Any]) -> None:
        import json  # here: a command without --progress json (a quick `path`) never needs it

        print(json.dumps(data, sort_keys=True), file=self.stream, flush=True)
