"""The process's descriptor limit (RLIMIT_NOFILE), and how a server's
listeners share it.

Every connection a listener accepts holds descriptors until it closes (one,
or three for a connection relayed to a server behind: the client's socket
and both ends of the link). Listeners that may take every descriptor leave
none to open the store, start a runner or accept on another socket: each
such call fails with EMFILE. So a server raises its soft limit to the hard
one, keeps a reserve for its own work, and gives each listener at most an
equal part of the rest.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

RESERVE_MIN = 256    # descriptors kept for work other than connections: store, runners, fetches, threads
RESERVE_SHARE = 8    # ...or this fraction (1/8) of the limit, when that is more


def raise_to_hard_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (to fs.nr_open where
    the hard limit is unlimited); (soft before, soft now). A limit the
    kernel refuses to raise is kept as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _nr_open() if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return soft, target
        except (ValueError, OSError):
            pass
    return soft, soft


def current_limit() -> int:
    """The soft RLIMIT_NOFILE in effect."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return _nr_open() if soft == resource.RLIM_INFINITY else soft


def _nr_open() -> int:
    try:
        return int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        return 1 << 20   # Linux's default fs.nr_open


def descriptors_in_use() -> int:
    """How many descriptors this process holds now."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1   # less the one the listing held
    except OSError:
        return 64


def reserve_for(limit: int) -> int:
    """Descriptors kept out of every listener's reach."""
    return max(RESERVE_MIN, limit // RESERVE_SHARE)


@dataclass(frozen=True)
class ListenerNeed:
    """What one listener asks for: ``wanted`` connections of ``descriptors`` each."""

    wanted: int
    descriptors: int = 1


def connection_caps(limit: int, in_use: int, needs: list[ListenerNeed]) -> list[int]:
    """The connections each listener may hold at once: what it wants, up to
    an equal part of the descriptors left once ``in_use`` and the reserve
    are counted (a listener wanting less than its part leaves the rest to
    the others). Together they cannot take the reserve; each gets at least
    one connection."""
    left = max(0, limit - in_use - reserve_for(limit))
    caps = [0] * len(needs)
    waiting = len(needs)
    for i in sorted(range(len(needs)), key=lambda i: needs[i].wanted * needs[i].descriptors):
        part = left // waiting
        caps[i] = max(1, min(needs[i].wanted, part // needs[i].descriptors))
        left = max(0, left - caps[i] * needs[i].descriptors)
        waiting -= 1
    return caps
