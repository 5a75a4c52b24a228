"""The one backoff: doubling up to a ceiling, and equal jitter."""

from __future__ import annotations

import random

from cartonstore.system.backoff import doubling, equal_jitter


def test_doubling_starts_at_the_first_delay_and_stops_at_the_ceiling() -> None:
    assert [doubling(0.5, 30.0, n) for n in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert doubling(0.0, 30.0, 5) == 0.0


def test_doubling_holds_at_the_ceiling_however_many_failures() -> None:
    # a pre-warm keeper never gives up: its failure count grows past what a float can double
    assert doubling(0.5, 30.0, 1100) == 30.0
    assert doubling(0.5, 30.0, 10 ** 6) == 30.0


def test_equal_jitter_keeps_at_least_half_the_delay() -> None:
    rng = random.Random(7)
    draws = [equal_jitter(4.0, rng) for _ in range(2000)]
    assert min(draws) >= 2.0 and max(draws) <= 4.0
    assert min(draws) < 2.1 and max(draws) > 3.9   # the whole half-range, not a point in it
