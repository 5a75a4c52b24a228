"""Where one request's time went in the daemon, counted in the statistics
of the model version that ran it (Triton's statistics extension)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cartonstore.v2.statistics import RequestTiming

if TYPE_CHECKING:
    from cartonstore.server.models.loaded_model import LoadedModel


@dataclass
class Phases:
    """Where a request's time went in the daemon, for the statistics of
    the model version (``runners``) that ran it."""

    started: int = field(default_factory=time.monotonic_ns)
    runners: Any = None          # the ModelRunners it was forwarded to
    checked: int = 0             # monotonic ns at each step's end
    answered: int = 0
    runner_timing: RequestTiming | None = None
    batch: int = 1
    execution: int | None = None   # rows of the execution it starts (None: its own batch; 0: counted elsewhere)
    cache_hit_ns: int | None = None    # answered from the response cache, after this long looking it up
    cache_miss_ns: int | None = None   # looked up and not found: the lookup's and the store's time

    def record(self, model: LoadedModel, ok: bool) -> None:
        runners = self.runners if self.runners is not None else model.runners
        if runners is None:
            return
        now = time.monotonic_ns()
        if not ok:
            runners.statistics.record_failure(now - self.started)
            return
        if self.cache_hit_ns is not None:
            runners.statistics.record_cache_hit(now - self.started, self.cache_hit_ns)
            return
        checking, shaping = self.checked - self.started, now - self.answered
        round_trip = self.answered - self.checked
        inside = self.runner_timing.believed(round_trip) if self.runner_timing is not None else None
        if inside is None:   # a runner that does not say: its whole round trip is the model's time
            timing = RequestTiming(0, checking, round_trip, shaping)
        else:
            timing = RequestTiming(inside.queue_ns, checking + inside.input_ns, inside.infer_ns,
                                   inside.output_ns + shaping)
        runners.statistics.record_success(now - self.started, timing, self.batch, self.execution,
                                          self.cache_miss_ns)
