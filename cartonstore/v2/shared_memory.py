"""The shared-memory parameters of Triton's shared-memory extension, on
request inputs and requested outputs: "shared_memory_region" (a registered
region's name), "shared_memory_byte_size" and the optional
"shared_memory_offset" (bytes into the region, default 0). Pure parsing;
the daemon keeps the registry of regions (server/tensors/shm_regions.py),
a runner maps them (runner/shm.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cartonstore.errors import InvalidInput

from .elements import fail

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
_KEYS = (REGION, BYTE_SIZE, OFFSET)


@dataclass(frozen=True, slots=True)
class ShmRef:
    """Where a tensor's bytes are: ``byte_size`` bytes at ``offset`` into
    the region named ``region``."""

    region: str
    offset: int
    byte_size: int

    @property
    def end(self) -> int:
        return self.offset + self.byte_size


class ShmSink:
    """Where an output requested in shared memory goes: up to ``capacity``
    bytes, written by ``write``; ``region`` is the name the response gives.
    This one writes into a buffer (a view of a mapping); a runner's writes
    check the object's size first, or go through its fd (pwrite) for a
    region another uid may truncate (cartonstore.runner.shm). ``offset``, when
    given, is where the view starts in the region: the response says it."""

    offset: int | None = None   # subclasses that write elsewhere keep this default

    def __init__(self, region: str, view: memoryview, offset: int | None = None) -> None:
        self.region = region
        self.capacity = len(view)
        self.offset = offset
        self._view = view

    def write(self, chunk: bytes | memoryview) -> None:
        size = len(chunk)   # bytes: encode._write_to_shm hands a byte view
        # numpy's copy lets go of the GIL for big tensors; a memoryview slice assignment would not
        np.copyto(np.frombuffer(self._view, np.uint8, count=size), np.frombuffer(chunk, np.uint8))

    def close(self) -> None:
        pass



class RegionTooSmall(InvalidInput):
    """An output does not fit the shared memory the request gave it: the
    request's fault (400), though it is found only after the model ran."""


class RegionShrunk(RegionTooSmall):
    """The region's object was truncated while the request ran: found right
    before an output was copied into it, instead of a SIGBUS."""


def shm_ref(parameters: dict[str, Any], what: str) -> ShmRef | None:
    """The tensor's place in shared memory, None when it names none.
    Triton's rule: region and byte size come together; the offset may not
    come alone."""
    if not any(key in parameters for key in _KEYS):
        return None
    region = parameters.get(REGION)
    size = parameters.get(BYTE_SIZE)
    if region is None or size is None:
        given = ", ".join(key for key in _KEYS if key in parameters)
        raise fail(what, f"{REGION} and {BYTE_SIZE} must be given together (given: {given})")
    if type(region) is not str or not region:
        raise fail(what, f"{REGION} must be a non-empty string, not {region!r}")
    offset = parameters.get(OFFSET, 0)
    for key, value in ((BYTE_SIZE, size), (OFFSET, offset)):
        if type(value) is not int or value < 0:
            raise fail(what, f"{key} must be an integer >= 0, not {value!r}")
    return ShmRef(region, offset, size)


def missing_region(ref: ShmRef, what: str) -> InvalidInput:
    return fail(what, f"unable to find system shared memory region {ref.region!r}: register it first")


def check_within(ref: ShmRef, region_size: int, what: str) -> None:
    """The bytes ``ref`` names lie inside its region of ``region_size`` bytes."""
    if ref.end > region_size:
        raise fail(what, f"{OFFSET} {ref.offset} + {BYTE_SIZE} {ref.byte_size} runs past the end of region "
                         f"{ref.region!r} ({region_size} bytes)")


def with_region(parameters: dict[str, Any], region: str) -> dict[str, Any]:
    """``parameters`` naming ``region`` instead (the daemon's own name for
    a client's region, on the way to a runner, and back)."""
    return {**parameters, REGION: region}
