"""A request's wait for a ready runner while its model's runners restart.

A request that finds no READY instance because they are (re)starting, or
whose instance died before the request was written to it, waits for the
next instance to be ready, at most ``runners.restart_wait`` in all; past
it, or when no instance will serve again, it is refused (503) with why.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from cartonstore.errors import Unavailable

from .instance import RunnerInstance
from .process import seconds
from .settings import READY, UNAVAILABLE

# An instance whose request found its runner gone may still look READY until
# the supervisor sees the exit: the most a request waits for that before
# trying again.
UNSENT_PAUSE = 0.05


class Pool(Protocol):
    name: str

    @property
    def state(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def closing(self) -> bool: ...

    def pick(self) -> RunnerInstance | None: ...

    def unloading(self) -> Unavailable: ...

    def state_changed(self) -> asyncio.Event: ...


class RestartWait:
    """One request's wait, ``limit`` seconds from when it first has to wait."""

    def __init__(self, pool: Pool, limit: float) -> None:
        self._pool = pool
        self._limit = limit
        self._deadline: float | None = None
        self._unsent = ""   # why the last try did not reach its runner

    async def ready_instance(self) -> RunnerInstance:
        """The instance to send the request to, once one is READY."""
        pool = self._pool
        while True:
            if pool.closing:
                raise pool.unloading()
            inst = pool.pick()
            if inst is not None:
                return inst
            if pool.state == UNAVAILABLE:   # none will serve again: nothing to wait for
                raise Unavailable(f"model {pool.name} has no ready runner (unavailable): {pool.reason}",
                                  subject=pool.name)
            await self._until_change(None)

    async def after_unsent(self, inst: RunnerInstance, why: str) -> None:
        """``inst`` did not get the request (``why``): wait until its state
        changes when it still looks READY, so the next pick sees its death."""
        self._unsent = why
        if inst.state == READY:
            await self._until_change(UNSENT_PAUSE)

    async def _until_change(self, at_most: float | None) -> None:
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self._limit
        left = self._deadline - now
        if left <= 0:
            pool = self._pool
            why = pool.reason or self._unsent
            raise Unavailable(f"model {pool.name} has no ready runner ({pool.state.lower()}) after waiting "
                              f"runners.restart_wait {seconds(self._limit)}: {why}", subject=pool.name)
        changed = self._pool.state_changed()
        try:
            await asyncio.wait_for(changed.wait(), left if at_most is None else min(left, at_most))
        except asyncio.TimeoutError:
            pass
