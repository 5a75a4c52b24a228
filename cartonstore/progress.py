"""Showing transfers to a person or a script.

A bar (tqdm) on a terminal, a plain line every few seconds when stderr is
not a terminal, JSON lines for scripts, or nothing. Always on stderr, so
stdout keeps only the result.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TextIO

from .units import format_size

MODES = ("auto", "bar", "plain", "json", "none")
PLAIN_INTERVAL = 5.0


class Progress:
    def __init__(self, mode: str = "auto", stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "plain"
        self.mode = mode
        self.total = 0
        self.started = time.monotonic()
        self._last_plain = self.started
        self._bar = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=None, unit="B", unit_scale=True, unit_divisor=1024, file=self.stream,
                             desc="fetching", leave=False, dynamic_ncols=True)

    def bytes(self, n: int) -> None:
        self.total += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.mode == "plain":
            now = time.monotonic()
            if now - self._last_plain >= PLAIN_INTERVAL:
                self._last_plain = now
                rate = self.total / max(now - self.started, 1e-9)
                print(f"fetched {format_size(self.total)} ({format_size(int(rate))}/s)", file=self.stream, flush=True)
        elif self.mode == "json":
            now = time.monotonic()
            if now - self._last_plain >= 1.0:
                self._last_plain = now
                self._json({"event": "progress", "bytes": self.total})

    def event(self, data: dict) -> None:
        if self.mode == "json":
            self._json(data)
        elif data.get("event") == "name":  # a name moved or kept: said in every mode, it is not progress
            self._say(data["message"])
        elif self.mode == "plain" and data.get("event") == "carton":
            print(f"reading {data.get('url')}", file=self.stream, flush=True)
        elif self._bar is not None and data.get("url"):
            self._bar.set_description_str(f"fetching {data['url']}"[:60])

    def close(self, summary: dict | None = None) -> None:
        if self._bar is not None:
            self._bar.close()
        seconds = time.monotonic() - self.started
        if summary is not None and self.mode == "json":
            self._json({"event": "done", "bytes": self.total, "seconds": round(seconds, 3), **summary})
        elif summary is not None and self.mode in ("plain", "bar") and self.total:
            print(f"transferred {format_size(self.total)} in {seconds:.1f}s", file=self.stream, flush=True)

    def _say(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def _json(self, data: dict) -> None:
        print(json.dumps(data, sort_keys=True), file=self.stream, flush=True)
