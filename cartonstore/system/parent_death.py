"""Dying with the parent: prctl(PR_SET_PDEATHSIG), so that nothing the
daemon starts outlives it, even when it is SIGKILLed.

Set in two places: between fork and exec, as a runner's preexec_fn
(server/runner_processes/process.py); and first thing in a process that sets it
itself: a runner started by anything else (runner/lifecycle.py), and the
check worker (server/checks/worker.py), which the daemon starts without a
preexec_fn (one makes CPython fork the whole daemon instead of using
vfork). Runners keep the preexec_fn: their argv may be any program, one
that never arms itself.

The signal comes when the *thread* that forked exits, not the process:
the daemon starts runners and workers from its event loop's thread, never
from a worker thread (asyncio.to_thread) that may end before them.
"""

from __future__ import annotations

import os
import signal

from .syscalls import PR_SET_PDEATHSIG, prctl


def die_with(parent_pid: int, sig: int = signal.SIGKILL) -> int:
    """Have the kernel send ``sig`` to this process when its parent exits;
    and if its parent is not ``parent_pid`` any more (it died before this
    ran, so the signal would never come), exit now. Returns 0, or the errno
    of a prctl that failed (ENOSYS where there is none: not Linux)."""
    failed = 0
    try:
        prctl(PR_SET_PDEATHSIG, int(sig))
    except OSError as e:
        failed = e.errno or 0
    if os.getppid() != parent_pid:
        os._exit(1)
    return failed
