"""The value type for one file of a carton, shared by checks, index and materialize."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EntryRow:
    """One MANIFEST line as the store keeps it. ``size`` is None while the
    blob's size is unknown (listed only in LINKS); a symlink's ``digest`` is
    that of the file it resolves to, and ``target`` its relative target."""

    path: str
    digest: str
    size: int | None
    kind: str  # "file" or "symlink"
    target: str | None
