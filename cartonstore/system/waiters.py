"""Futures a protocol's callbacks settle for the coroutine that waits on
them (data arrived, the buffer drained, the peer left): settling one that
is absent or already settled is a no-op, since a callback cannot know
whether anyone still waits."""

from __future__ import annotations

import asyncio


def wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def fail(waiter: asyncio.Future[None] | None, exc: BaseException) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_exception(exc)
