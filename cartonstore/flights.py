"""In-process single flight: concurrent callers asking for the same key share
one task (one download, one build) instead of each starting their own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
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
