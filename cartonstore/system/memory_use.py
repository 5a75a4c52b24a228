"""How much host memory processes hold: a cgroup's charge (v2
``memory.current``, v1 ``memory.usage_in_bytes``) where a process has a
cgroup of its own, else the resident
sets (VmRSS) of the process and every process it started. Reads /proc and
/sys: call it off the event loop."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def cgroup_bytes(cgroup_dir: Path) -> int | None:
    """Memory charged to a cgroup (anonymous memory and the page cache it
    caused): v2's memory.current, v1's memory.usage_in_bytes; None when
    neither can be read."""
    for name in ("memory.current", "memory.usage_in_bytes"):
        try:
            return int((cgroup_dir / name).read_text())
        except (OSError, ValueError):
            continue
    return None


def tree_rss(pids: Iterable[int]) -> dict[int, int]:
    """Each pid's resident bytes with those of its descendants (a sandbox's
    wrapper and the runner inside it); a pid gone meanwhile counts 0."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            pid = int(entry)
            status = _status(pid)
            if status is not None:
                parents[pid], rss[pid] = status
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    out = {}
    for root in pids:
        total, todo = 0, [root]
        while todo:
            pid = todo.pop()
            total += rss.get(pid, 0)
            todo.extend(children.get(pid, ()))
        out[root] = total
    return out


def _status(pid: int) -> tuple[int, int] | None:
    """(parent pid, resident bytes) from /proc/<pid>/status."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    parent, resident = 0, 0
    for line in text.splitlines():
        if line.startswith("PPid:"):
            parent = int(line.split()[1])
        elif line.startswith("VmRSS:"):
            resident = int(line.split()[1]) * 1024   # in kB
    return parent, resident
