"""Triton's statistics counters (pure). The runner's timing header they
are fed from: tests/runner/test_protocol.py."""

from __future__ import annotations

from kit.together import all_at_once

from cartonstore.v2.statistics import InferStatistics, RequestTiming, statistics_answer


def test_counters_as_triton_answers_them() -> None:
    stats = InferStatistics()
    stats.record_success(1000, RequestTiming(10, 20, 30, 40), batch=4)
    stats.record_success(2000, RequestTiming(1, 2, 3, 4))
    stats.record_failure(500)
    stats.record_failure(-5)   # a clock that went back counts the request, not negative time
    entry = stats.model_stats("m", "v")
    assert (entry["inference_count"], entry["execution_count"]) == (5, 2)
    s = entry["inference_stats"]
    assert s["success"] == {"count": 2, "ns": 3000} and s["fail"] == {"count": 2, "ns": 500}
    assert s["queue"] == {"count": 2, "ns": 11} and s["compute_output"] == {"count": 2, "ns": 44}
    assert s["cache_hit"] == {"count": 0, "ns": 0} and entry["last_inference"] > 0
    assert statistics_answer([entry]) == {"model_stats": [entry]}
    snap = stats.snapshot()
    assert snap["success"] == (2, 3000) and snap["inference_count"] == 5


def test_concurrent_recorders_lose_nothing() -> None:
    stats = InferStatistics()

    def record() -> None:
        for _ in range(2000):
            stats.record_success(1, RequestTiming(1, 1, 1, 1))
            stats.record_failure(1)
    all_at_once([record] * 4)
    snap = stats.snapshot()
    assert snap["success"] == (8000, 8000) and snap["fail"] == (8000, 8000) and snap["execution_count"] == 8000


def test_a_timing_is_believed_only_within_the_time_waited() -> None:
    timing = RequestTiming(1, 2, 3, 4)
    assert timing.believed(10) is timing and timing.believed(100) is timing
    assert timing.believed(9) is None
