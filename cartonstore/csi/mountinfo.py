"""The mount table as /proc/self/mountinfo writes it (proc(5)), parsed
without I/O: which target paths hold which mounts, and which of them are a
model directory of the store bound there.

A line: ``id parent major:minor root mount_point options [optional...] -
fstype source super_options``; paths have space, tab, newline and backslash
written as three-digit octal escapes (``\\040``). ``root`` is the path inside
the mounted filesystem, so a bind mount of ``<store>/models/<digest>`` shows
that path (relative to its filesystem's own root) whatever the mount point.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cartonstore.errors import InvalidInput

_ESCAPE = re.compile(r"\\([0-7]{3})")
_SHA256 = re.compile(r"[0-9a-f]{64}")
DELETED = "//deleted"   # the kernel's mark on a root whose directory was removed


@dataclass(frozen=True)
class Mount:
    mount_id: int
    root: str
    mount_point: str
    options: tuple[str, ...]
    fstype: str

    @property
    def is_read_only(self) -> bool:
        return "ro" in self.options

    @property
    def is_deleted(self) -> bool:
        return self.root.endswith(DELETED)

    @property
    def model_digest(self) -> str | None:
        """The manifest hash when this is a model directory of a store bound
        here (its root is ``.../models/<sha256>``), else None."""
        root = self.root.removesuffix(DELETED)
        parent, _, leaf = root.rpartition("/")
        return leaf if _SHA256.fullmatch(leaf) and parent.endswith("/models") else None


def unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m[1], 8)), field)


def parse_line(line: str, number: int = 0) -> Mount:
    fields = line.split(" ")
    try:
        separator = fields.index("-", 6)
        return Mount(int(fields[0]), unescape(fields[3]), unescape(fields[4]), tuple(fields[5].split(",")),
                     fields[separator + 1])
    except (ValueError, IndexError):
        raise InvalidInput(f"mountinfo line {number}: not 'id parent dev root mount_point options ... - fstype "
                           f"source super_options': {line[:200]!r}") from None


def parse_mountinfo(text: str) -> list[Mount]:
    return [parse_line(line, n) for n, line in enumerate(text.splitlines(), 1) if line]


def mounts_at(mounts: list[Mount], path: str) -> list[Mount]:
    """The mounts stacked on ``path``, the visible one last (the table lists
    them in the order they were made)."""
    return [m for m in mounts if m.mount_point == path]
