"""Processes in /proc, for tests that assert nothing they started is left."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_GONE = ("Z", "X")  # a zombie has exited; only its parent's wait() is missing


def _stat(pid: str | int) -> list[str]:
    """/proc/PID/stat's fields after the command name: state, parent pid, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _state(pid: str | int) -> str:
    return _stat(pid)[0]


def live_pids(marker: str, *, parent: int | None = None) -> list[int]:
    """Processes (zombies excluded, this one too) whose command line holds
    marker; with ``parent``, only that process's children."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = _stat(entry)
        except OSError:
            continue
        if marker in cmdline and stat[0] not in _GONE and (parent is None or int(stat[1]) == parent):
            pids.append(int(entry))
    return pids


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    """True once pid no longer runs (gone, or a zombie)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _state(pid) in _GONE:
                return True
        except OSError:
            return True
        time.sleep(0.02)
    return False


def stop_process(proc, timeout: float = 10.0) -> None:  # noqa: ANN001 - a subprocess.Popen
    """SIGTERM, then SIGKILL after ``timeout``; reaped either way."""
    import subprocess

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert wait_gone(proc.pid)


@contextmanager
def script_leaving_no_process(path: Path, text: str) -> Iterator[Path]:
    """``text`` written to ``path`` (a script tests run as a process); on
    the way out, no process running it may be left."""
    path.write_text(text)
    yield path
    left = [pid for pid in live_pids(str(path)) if not wait_gone(pid, 5.0)]
    assert not left, f"processes running {path.name} left behind: {left}"
