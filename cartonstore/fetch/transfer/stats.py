"""What a fetch moves, counted where the bytes arrive.

TransferStats counts bytes received and expected, requests, retries, and
bytes and blobs by kind of source ("url": a carton's own URL or a LINKS
URL; "mirror": <mirror>/<sha256>, or a registry's mirror; "registry": an
OCI registry's blob; "hf": the Hugging Face endpoint's; "peer": another node's store (peers.py); "file": a
local carton, added by the puller). Every kind but "peer" is an origin.
Counting is two additions under a lock, cheap enough for every
chunk; whoever shows progress reads the counters at its own pace.

A Tally is one request's share of the expected total: what it planned to
receive counts until it ends, then exactly what it got, so that retries and
short bodies leave expected == received once everything has settled.
"""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from cartonstore.errors import FetchError
from cartonstore.fetch.http.client import tls_reason
from cartonstore.fetch.http.config import FetchConfig
from cartonstore.fetch.http.policy import describe

SOURCE_KINDS = ("file", "url", "mirror", "registry", "peer", "hf")


def stored_kind(kind: str) -> str:
    """The kind of source a blob fetched from a source of ``kind`` counts
    for in the store's figures (store/metadata/source_bytes.py): a
    registry's is "oci" there, as its references are written; the other
    kinds keep their names."""
    return "oci" if kind == "registry" else kind


@dataclass
class TransferStats:
    bytes_received: int = 0      # on the wire (encoded)
    requests: int = 0
    bytes_expected: int = 0      # what the requests made or planned so far will bring
    retries: int = 0
    source_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCE_KINDS, 0))
    source_blobs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCE_KINDS, 0))
    on_event: Callable[[dict], None] | None = None   # told of each retry
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def received(self, n: int, source: str = "url") -> None:
        with self._lock:
            self.bytes_received += n
            self.source_bytes[source] = self.source_bytes.get(source, 0) + n

    def read_locally(self, nbytes: int, blobs: int) -> None:
        """Blobs brought back from the local files they were added from: a
        source ("file"), but nothing received."""
        with self._lock:
            self.source_bytes["file"] = self.source_bytes.get("file", 0) + nbytes
            self.source_blobs["file"] = self.source_blobs.get("file", 0) + blobs

    def expect(self, n: int) -> None:
        with self._lock:
            self.bytes_expected += n

    def request(self) -> None:
        with self._lock:
            self.requests += 1

    def blobs(self, source: str, n: int = 1) -> None:
        with self._lock:
            self.source_blobs[source] = self.source_blobs.get(source, 0) + n

    def progress(self) -> tuple[int, int]:
        """(bytes received, bytes expected), read together."""
        with self._lock:
            return self.bytes_received, self.bytes_expected

    def snapshot(self) -> dict:
        with self._lock:
            return {"bytes_received": self.bytes_received, "requests": self.requests, "retries": self.retries,
                    "source_bytes": dict(self.source_bytes), "source_blobs": dict(self.source_blobs)}

    def since(self, before: dict) -> dict:
        """What moved since ``before`` (a snapshot), in the snapshot's shape."""
        now = self.snapshot()
        out: dict = {k: now[k] - before[k] for k in ("bytes_received", "requests", "retries")}
        for k in ("source_bytes", "source_blobs"):
            out[k] = {s: now[k].get(s, 0) - before[k].get(s, 0) for s in {*SOURCE_KINDS, *now[k]}}
        return out

    def retried(self, url: str, attempt: int, retries: int, delay: float, error: FetchError) -> None:
        with self._lock:
            self.retries += 1
        if self.on_event is not None:
            reason = retry_reason(error, url)
            self.on_event({"event": "retry", "url": describe(url), "attempt": attempt, "retries": retries,
                           "delay": round(delay, 3), "reason": reason,
                           "message": f"retry {attempt}/{retries} in {delay:.1f} s: {reason}"})


class Tally:
    """One request's bytes: ``planned`` counts in the expected total (unless
    ``counted`` already) until settle() replaces it with what arrived."""

    __slots__ = ("_lock", "got", "planned", "source", "stats")

    def __init__(self, stats: TransferStats | None, planned: int = 0, *, source: str = "url",
                 counted: bool = False) -> None:
        self.stats = stats
        self.source = source
        self.planned = planned
        self.got = 0
        self._lock = threading.Lock()  # add() runs in the threads of parts read from their sockets
        if stats is not None and planned and not counted:
            stats.expect(planned)

    def add(self, n: int) -> None:
        with self._lock:
            self.got += n
        if self.stats is not None:
            self.stats.received(n, self.source)

    def more(self, n: int) -> None:
        """Bytes beyond the plan are on their way (a body longer than needed)."""
        self.planned += n
        if self.stats is not None:
            self.stats.expect(n)

    def settle(self) -> None:
        if self.stats is not None and self.got != self.planned:
            self.stats.expect(self.got - self.planned)
        self.planned = self.got


def retry_hook(stats: TransferStats | None, config: FetchConfig,
               url: str) -> Callable[[FetchError, float], None] | None:
    """An on_retry for http.with_retries that numbers the retries of one call."""
    if stats is None:
        return None
    count = 0

    def hook(error: FetchError, delay: float) -> None:
        nonlocal count
        count += 1
        stats.retried(url, count, config.retries, delay, error)
    return hook


def retry_reason(error: FetchError, url: str) -> str:
    """Why a request failed, in a few words for a person: the system's words
    for a socket error ("connection refused"), else the error's message
    without the URL it starts with and without a library's details."""
    cause: BaseException | None = error.__cause__ or error.__context__
    seen = 0
    while cause is not None and seen < 8:
        if isinstance(cause, ssl.SSLError):  # its errno (1) is not the reason
            return tls_reason(cause)
        if isinstance(cause, OSError) and cause.errno:
            return os.strerror(cause.errno).lower()
        if isinstance(cause, TimeoutError):
            return "timed out"
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    text = error.message
    for prefix in (f"{describe(error.subject or url)}: ", f"{describe(url)}: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    if (error.__cause__ is not None and not isinstance(error.__cause__, FetchError)
            and text.endswith(")") and " (" in text):
        text = text[: text.rindex(" (")]  # "connection failed (<a library's words>)"
    return text.splitlines()[0] if text else "failed"
