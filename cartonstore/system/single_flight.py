"""In-process single flight: concurrent callers asking for the same key share
one task (one download, one build) instead of each starting their own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any


class SingleFlight:
    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Future] = {}

    async def run(self, key: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """make()'s result, from the task already running for key or a new one.
        A caller that gives up does not cancel the task for the others (shield)."""
        task = self._tasks.get(key)
        if task is None:
            task = asyncio.ensure_future(make())
            self._tasks[key] = task
            task.add_done_callback(lambda _t: self._tasks.pop(key, None))
        return await asyncio.shield(task)


async def all_or_none(work: Iterable[Awaitable]) -> list:
    """Their results; on the first failure the rest are cancelled and waited
    for, and it is raised."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
