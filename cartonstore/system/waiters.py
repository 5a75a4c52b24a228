"""Futures a protocol's callbacks settle for the coroutine that waits on
them (data arrived, the buffer drained, the peer left): settling one that
is absent or already settled is a no-op, since a callback cannot know
whether anyone still waits; and ``within``, a wait bounded in time.

``within`` rather than asyncio.wait_for, from Python 3.11: no extra task
per wait (a request's every read waits so)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

if sys.version_info >= (3, 11):
    async def within(awaitable: Awaitable[T], seconds: float) -> T:
        """``awaitable``'s result, or TimeoutError after ``seconds``."""
        async with asyncio.timeout(seconds):
            return await awaitable
else:                                  # pragma: no cover - Python 3.10
    within = asyncio.wait_for


def wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def fail(waiter: asyncio.Future[None] | None, exc: BaseException) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_exception(exc)


class Broadcast:
    """A wake-up for every coroutine waiting for the next change: ``next()``
    is the event the coming ``wake()`` sets; each wake starts a new one, so
    a waiter that looks again after it waits for the change after that."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def next(self) -> asyncio.Event:
        return self._event

    def wake(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()
