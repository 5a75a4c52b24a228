"""A runner's life outside HTTP: dying with its parent, and reporting a
model that cannot load (one stderr line, exit status 3)."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import NoReturn

from cartonstore.system.parent_death import die_with

from .context import LoadError
from .protocol import EXIT_LOAD_FAILED


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` when the process that started this one
    exits, so no runner outlives a SIGKILLed daemon.

    The daemon sets the same thing between fork and exec; doing it here as
    well covers runners started by anything else. If the parent is already
    gone (it died before this ran), exit now rather than serve nobody.
    (PID 1 may well be a real parent, e.g. a daemon that is a container's
    init, so only a change of parent counts.)
    """
    if not sys.platform.startswith("linux"):
        return
    failed = die_with(os.getppid(), sig)
    if failed:
        print(f"cartonstore runner: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(failed)}", file=sys.stderr)


def fail_load(message: str) -> NoReturn:
    """Report a model that cannot be loaded and exit with status 3."""
    line = " ".join(message.split()) or "the model could not be loaded"
    print(f"cartonstore runner: cannot load the model: {line}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_LOAD_FAILED)


def describe_load_exception(exc: BaseException) -> str:
    """The one-line reason for a load failure. A LoadError's message is the
    reason as written; anything else is unexpected, so its traceback goes
    to stderr first (for whoever reads the full log) and the line names
    the exception type."""
    if isinstance(exc, LoadError):
        return str(exc)
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    return f"{type(exc).__name__}: {exc}"
