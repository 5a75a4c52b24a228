"""Processes in /proc, for tests that assert nothing they started is left."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kit.daemonkit import wait_for

_GONE = ("Z", "X")  # a zombie has exited; only its parent's wait() is missing


def _stat(pid: str | int) -> list[str]:
    """/proc/PID/stat's fields after the command name: state, parent pid, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _state(pid: str | int) -> str:
    return _stat(pid)[0]


def started_since_boot(pid: int) -> float:
    """When process ``pid`` started, in seconds since boot, on the clock of
    time.clock_gettime(time.CLOCK_BOOTTIME) and at most one clock tick early.
    Compare it with that clock: /proc/stat's btime, the way to wall-clock
    time, is whole seconds, so an epoch time made from it is up to 1 s early."""
    return int(_stat(pid)[19]) / os.sysconf("SC_CLK_TCK")


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


def descriptors_of(pid: int, path: Path) -> int:
    """How many descriptors of ``path`` process ``pid`` holds (a lock file
    it waits on, say: the store's locks poll with the file open). ``path``
    resolved, as the kernel names it."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        names = os.listdir(fds)
    except OSError:   # gone
        return 0
    count = 0
    for name in names:
        try:
            count += os.readlink(fds / name) == str(path)
        except OSError:   # closed meanwhile
            continue
    return count


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    """True once pid no longer runs (gone, or a zombie)."""
    return wait_for(lambda: _is_gone(pid), timeout, 0.02)


def _is_gone(pid: int) -> bool:
    try:
        return _state(pid) in _GONE
    except OSError:
        return True


def stop_process(proc, timeout: float = 10.0) -> None:  # a subprocess.Popen
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
