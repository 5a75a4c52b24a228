"""The one child stop: SIGTERM, grace, SIGKILL, reaped; real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from cartonstore.system.child_stop import stop_child

IGNORES_SIGTERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "print(flush=True); time.sleep(60)")
SLEEPS = "import time; print(flush=True); time.sleep(60)"


async def _stopped(code: str, grace: float, *, ask: int | None = signal.SIGTERM) -> int:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    assert proc.stdout is not None
    await proc.stdout.readline()   # its handler is set

    def to_group(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    await stop_child(to_group, asyncio.ensure_future(proc.wait()), grace, ask=ask)
    assert proc.returncode is not None   # reaped on return
    return proc.returncode


def test_a_child_that_ends_at_sigterm_is_not_killed() -> None:
    assert asyncio.run(_stopped(SLEEPS, 30.0)) == -signal.SIGTERM


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    assert asyncio.run(_stopped(IGNORES_SIGTERM, 0.2)) == -signal.SIGKILL


def test_a_child_asked_otherwise_is_sent_sigkill_alone() -> None:
    assert asyncio.run(_stopped(SLEEPS, 0.0, ask=None)) == -signal.SIGKILL
