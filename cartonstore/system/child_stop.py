"""Stopping a child process: ask it to end, give it a grace period, then
SIGKILL it, and return once it is reaped (no zombie, no straggler left to
a caller that believes it gone)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any


async def stop_child(signal_child: Callable[[int], None], exit_seen: asyncio.Future[Any], grace: float, *,
                     ask: int | None = signal.SIGTERM) -> None:
    """Send ``ask`` (None: the caller asked already, say by closing its
    stdin), wait up to ``grace`` seconds for ``exit_seen``, then SIGKILL;
    return once the exit is seen. ``signal_child`` sends a signal to the
    child, or to its process group where what it forked must end with it:
    SIGKILL goes even after the exit, to those helpers, so a sender to the
    process alone checks that it still runs."""
    if not exit_seen.done():
        if ask is not None:
            signal_child(ask)
        if grace > 0:
            await asyncio.wait([exit_seen], timeout=grace)
    signal_child(signal.SIGKILL)
    await asyncio.shield(exit_seen)
