"""Triton's statistics extension: the counters of one model version, in
the shape GET /v2/models[/{name}[/versions/{v}]]/stats answers them, and
where one request's time went (RequestTiming; a runner sends it back in
a header, cartonstore.runner.protocol's TIMING_HEADER).

Pure: the runner SDK and the daemon both keep their counters here.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

# Triton's inference_stats keys, in its order
STAT_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
             "cache_miss")
# a decoupled model's responses by their index in its stream (Triton's response_stats)
RESPONSE_KEYS = ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")
RESPONSE_INDICES = 256   # responses past these count in their request's figures alone: the answer stays small


@dataclass
class RequestTiming:
    """Where one request's time went inside a runner, in nanoseconds:
    waiting for a free model thread, decoding the inputs, in the model,
    encoding the outputs."""

    queue_ns: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0

    def believed(self, waited_ns: int) -> RequestTiming | None:
        """This timing, if its parts fit in the ``waited_ns`` the caller
        waited for the answer; else None (a runner's header is its own word:
        one claiming more time than passed is not believed)."""
        total = self.queue_ns + self.input_ns + self.infer_ns + self.output_ns
        return self if total <= waited_ns else None


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += max(0, ns)

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class InferStatistics:
    """The counters of one model version, as Triton keeps them:
    ``success``/``fail`` count requests and their whole time in the server;
    ``queue`` and the three ``compute_*`` count successful executions and
    the time of each phase. Thread-safe: model threads and the event loop
    both record."""

    durations: dict[str, Duration] = field(default_factory=lambda: {k: Duration() for k in STAT_KEYS})
    inference_count: int = 0     # inferences (a batch of n counts n; one request counts its batch size)
    execution_count: int = 0     # model executions
    last_inference_ms: int = 0
    # executions by batch size: compute_input, compute_infer, compute_output (Triton's batch_stats)
    batch_durations: dict[int, tuple[Duration, Duration, Duration]] = field(default_factory=dict)
    response_durations: dict[int, dict[str, Duration]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_success(self, total_ns: int, timing: RequestTiming, batch: int = 1,
                       execution: int | None = None, cache_miss_ns: int | None = None) -> None:
        """One request of ``batch`` rows that succeeded. ``execution``: the
        rows of the model execution it starts (its own batch unless given;
        0 for a request whose execution is recorded on its own, as dynamic
        batching records its batches: record_execution). ``cache_miss_ns``:
        the time it spent looking up and storing its answer in the response
        cache, for a request the cache did not hold (None: not looked up)."""
        execution = batch if execution is None else execution
        with self._lock:
            d = self.durations
            d["success"].add(total_ns)
            if cache_miss_ns is not None:
                d["cache_miss"].add(cache_miss_ns)
            d["queue"].add(timing.queue_ns)
            d["compute_input"].add(timing.input_ns)
            d["compute_infer"].add(timing.infer_ns)
            d["compute_output"].add(timing.output_ns)
            self.inference_count += batch
            if execution:
                self._executed(execution, timing)
            self.last_inference_ms = int(time.time() * 1000)

    def record_cache_hit(self, total_ns: int, lookup_ns: int) -> None:
        """One request answered from the response cache: a success whose
        model did not run, so no inference, execution or compute phase
        counts it (as Triton counts a hit)."""
        with self._lock:
            self.durations["success"].add(total_ns)
            self.durations["cache_hit"].add(lookup_ns)
            self.last_inference_ms = int(time.time() * 1000)

    def record_execution(self, rows: int, timing: RequestTiming) -> None:
        """One model execution of ``rows`` rows that requests joined (each
        request is recorded with execution=0)."""
        with self._lock:
            self._executed(rows, timing)

    def _executed(self, rows: int, timing: RequestTiming) -> None:
        self.execution_count += 1
        by_size = self.batch_durations.setdefault(rows, (Duration(), Duration(), Duration()))
        for duration, ns in zip(by_size, (timing.input_ns, timing.infer_ns, timing.output_ns), strict=True):
            duration.add(ns)

    def record_response(self, index: int, infer_ns: int, output_ns: int, ok: bool) -> None:
        """Response ``index`` of a decoupled model's stream: ``infer_ns``
        from the request (or the response before) to it, ``output_ns`` to
        check and shape it; ``ok`` False for the error that ended a stream."""
        if index >= RESPONSE_INDICES:
            return
        with self._lock:
            d = self.response_durations.get(index)
            if d is None:
                d = self.response_durations[index] = {k: Duration() for k in RESPONSE_KEYS}
            d["compute_infer"].add(infer_ns)
            d["compute_output"].add(output_ns)
            d["success" if ok else "fail"].add(infer_ns + output_ns)

    def record_failure(self, total_ns: int) -> None:
        with self._lock:
            self.durations["fail"].add(total_ns)
            self.last_inference_ms = int(time.time() * 1000)

    def snapshot(self) -> dict[str, Any]:
        """The counters as plain numbers (for /metrics)."""
        with self._lock:
            return {"inference_count": self.inference_count, "execution_count": self.execution_count,
                    "last_inference": self.last_inference_ms,
                    **{k: (d.count, d.ns) for k, d in self.durations.items()}}

    def model_stats(self, name: str, version: str) -> dict[str, Any]:
        """One entry of Triton's model_stats[]."""
        with self._lock:
            return {"name": name, "version": version, "last_inference": self.last_inference_ms,
                    "inference_count": self.inference_count, "execution_count": self.execution_count,
                    "inference_stats": {k: d.as_json() for k, d in self.durations.items()},
                    "batch_stats": [{"batch_size": size, **{key: d.as_json() for key, d in zip(
                        ("compute_input", "compute_infer", "compute_output"), durations, strict=True)}}
                        for size, durations in sorted(self.batch_durations.items())],
                    **({"response_stats": {str(i): {k: d.as_json() for k, d in durations.items()}
                                           for i, durations in sorted(self.response_durations.items())}}
                       if self.response_durations else {})}


def statistics_answer(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model_stats": entries}
