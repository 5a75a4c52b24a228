"""Calls made at the same moment, for tests of concurrent callers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def all_at_once(calls: Sequence[Callable[[], T]], timeout: float = 300.0) -> list[T]:
    """Each call in a thread of its own, all started together; their
    results in order (the first exception raised again, once all ended)."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result(timeout) for future in futures]
