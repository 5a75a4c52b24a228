"""The daemon's event loop: uvloop where it is installed, else asyncio's.

Why: every infer request crosses the loop four times (client in, runner
out, runner in, client out). On uvloop the daemon's CPU per small request
fell from ~405 to ~320 us and its proxy overhead p50 from 0.46 to 0.36 ms
(tests/bench/bench_infer.py, same run, 2-core VM).

uvloop has no loop.sendfile; that costs nothing here, since requests
relayed to aiohttp cannot use sendfile on either loop (relay.py says why).
CARTONSTORE_EVENT_LOOP=asyncio keeps asyncio's loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from cartonstore.errors import InvalidInput

T = TypeVar("T")
ENV = "CARTONSTORE_EVENT_LOOP"


def loop_name() -> str:
    """"uvloop" or "asyncio": what run_loop will use."""
    wanted = os.environ.get(ENV, "uvloop").strip().lower()
    if wanted not in ("uvloop", "asyncio"):
        raise InvalidInput(f"{ENV}={wanted!r}: use uvloop or asyncio")
    if wanted == "uvloop":
        try:
            import uvloop  # noqa: F401 - imported to learn whether it is installed
        except ImportError:
            return "asyncio"
    return wanted


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    if loop_name() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
