"""Endpoints passed over for a while after they fail: a dead peer, mirror
or worker pool costs one timeout per period, not one per request that
would have asked it."""

from __future__ import annotations

import time
from collections.abc import Callable


class PassOver:
    """Endpoints not asked again until ``period`` seconds after their last failure."""

    def __init__(self, period: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.period = period
        self._clock = clock
        self._until: dict[str, float] = {}

    def __contains__(self, endpoint: object) -> bool:
        """Whether ``endpoint`` is passed over now."""
        until = self._until.get(endpoint) if isinstance(endpoint, str) else None
        return until is not None and self._clock() < until

    def add(self, endpoint: str) -> bool:
        """Pass ``endpoint`` over for ``period`` from now. True when it was
        not passed over already: the failure worth saying."""
        fresh = endpoint not in self
        self._until[endpoint] = self._clock() + self.period
        return fresh
