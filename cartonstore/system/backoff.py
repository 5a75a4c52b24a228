"""Waits between tries of something that failed: a delay that doubles from
a first one up to a ceiling, and the jitter that spreads many callers'
retries apart."""

from __future__ import annotations

import random

_MOST_DOUBLINGS = 1000   # 2.0 ** 1024 overflows a float; past this any ceiling is reached anyway


def doubling(first: float, ceiling: float, attempt: int) -> float:
    """``first`` doubled ``attempt`` times (attempt 0: ``first``), at most
    ``ceiling``. Any count of attempts, however many failures a keeper
    that never gives up has seen."""
    return min(ceiling, first * 2.0 ** min(max(attempt, 0), _MOST_DOUBLINGS))


def equal_jitter(delay: float, rng: random.Random | None = None) -> float:
    """A wait drawn evenly from [delay / 2, delay]: at least half the delay
    is kept, and callers that failed together do not retry together."""
    return (rng or random).uniform(delay / 2, delay)
