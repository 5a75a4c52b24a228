"""Signs that memory is short, read from the kernel: the host's pressure
stall information (/proc/pressure/memory: the share of the last 10 s some
task waited for memory) and how often the kernel reclaimed memory to keep
a cgroup under its limit (v2: ``memory.events`` high and max; v1: the
notifications of ``memory.pressure_level`` at level "low", through an
eventfd registered in ``cgroup.event_control``, since v1's
``memory.failcnt`` stays 0 on current kernels while reclaim runs). The
parsers are pure; the readers read /proc and /sys, so call them off the
event loop."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

HOST_PSI = Path("/proc/pressure/memory")


def psi_some_avg10(text: str) -> float | None:
    """``some avg10`` of a pressure file's text ("some avg10=1.50 avg60=...")."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "some":
            for item in fields[1:]:
                key, _, value = item.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


def limit_hits_v2(events_text: str) -> int | None:
    """The times a v2 cgroup went over memory.high or hit memory.max, from
    its memory.events text."""
    counts = {}
    for line in events_text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            counts[key] = int(value)
    if "high" not in counts and "max" not in counts:
        return None
    return counts.get("high", 0) + counts.get("max", 0)


def host_memory_psi(path: Path = HOST_PSI) -> float | None:
    """The host's memory ``some avg10`` (percent), None where PSI is off."""
    try:
        return psi_some_avg10(path.read_text())
    except OSError:
        return None


class LimitReclaims:
    """Reclaims each cgroup's memory limit caused so far, by cgroup
    directory; a v1 cgroup's count starts when it is first read (its
    eventfd registered then). Used from one thread at a time."""

    def __init__(self) -> None:
        self._v1: dict[Path, tuple[int, int, int]] = {}   # dir -> (eventfd, pressure_level fd, count so far)

    def read(self, cgroups: Iterable[Path]) -> dict[Path, int]:
        """The count of each of ``cgroups`` that can be read; the eventfds
        of cgroups no longer named are closed."""
        out = {}
        for cgroup in cgroups:
            try:
                hits = limit_hits_v2((cgroup / "memory.events").read_text())
                if hits is not None:
                    out[cgroup] = hits
                    continue
            except OSError:
                pass
            count = self._v1_count(cgroup)
            if count is not None:
                out[cgroup] = count
        for gone in set(self._v1) - set(out):
            self._drop(gone)
        return out

    def _v1_count(self, cgroup: Path) -> int | None:
        if cgroup not in self._v1:
            fds = _told_of_pressure(cgroup)
            if fds is None:
                return None
            self._v1[cgroup] = (*fds, 0)
        event, level, count = self._v1[cgroup]
        try:
            count += os.eventfd_read(event)
        except BlockingIOError:
            pass
        self._v1[cgroup] = (event, level, count)
        return count

    def _drop(self, cgroup: Path) -> None:
        event, level, _ = self._v1.pop(cgroup)
        os.close(event)
        os.close(level)

    def close(self) -> None:
        for cgroup in list(self._v1):
            self._drop(cgroup)


def _told_of_pressure(cgroup: Path) -> tuple[int, int] | None:
    """An eventfd the kernel counts the v1 cgroup's memory pressure in (at
    level low: reclaim ran), with the memory.pressure_level fd it holds
    open; None where that cannot be registered (not v1, not writable)."""
    opened: list[int] = []
    try:
        opened.append(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))
        opened.append(os.open(cgroup / "memory.pressure_level", os.O_RDONLY | os.O_CLOEXEC))
        (cgroup / "cgroup.event_control").write_text(f"{opened[0]} {opened[1]} low")
    except OSError:
        for fd in opened:
            os.close(fd)
        return None
    return opened[0], opened[1]
