"""Per-runner inference counters, reported like Triton's statistics
extension (GET /v2/models/{name}/stats), so a test can tell whether a
request ever reached the runner."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class InferStats:
    """Counters for one runner. ``success``/``fail`` count every infer
    request that reached the runner; ``queue`` is time spent waiting for a
    free worker, ``compute_infer`` time in the model (model executions)."""

    success: _Duration = field(default_factory=_Duration)
    fail: _Duration = field(default_factory=_Duration)
    queue: _Duration = field(default_factory=_Duration)
    compute_infer: _Duration = field(default_factory=_Duration)
    last_inference_ms: int = 0
    # Worker threads record compute time while the loop records the rest.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_request(self, ok: bool, started_ns: int) -> None:
        elapsed = time.monotonic_ns() - started_ns
        with self._lock:
            (self.success if ok else self.fail).add(elapsed)
            self.last_inference_ms = int(time.time() * 1000)

    def record_execution(self, queue_ns: int, compute_ns: int) -> None:
        with self._lock:
            self.queue.add(queue_ns)
            self.compute_infer.add(compute_ns)

    def as_json(self, name: str, version: str) -> dict[str, Any]:
        with self._lock:
            return {
                "model_stats": [
                    {
                        "name": name,
                        "version": version,
                        "last_inference": self.last_inference_ms,
                        "inference_count": self.success.count,
                        "execution_count": self.compute_infer.count,
                        "inference_stats": {
                            "success": self.success.as_json(),
                            "fail": self.fail.as_json(),
                            "queue": self.queue.as_json(),
                            "compute_infer": self.compute_infer.as_json(),
                        },
                    }
                ]
            }
