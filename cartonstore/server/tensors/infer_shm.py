"""An infer request that names shared-memory regions, on its way through
the daemon: each region checked for the caller (shm_regions.py), BYTES
inputs read for validation, the region names swapped for the runner's
names in the request, and swapped back in the runner's answer.

Only the JSON header is rewritten; binary tensor bytes after it are passed
on as they came.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from math import prod
from typing import Any

from cartonstore.v2.elements import fail
from cartonstore.v2.framing import HEADER_LENGTH, InferRequest, WireTensor
from cartonstore.v2.shared_memory import REGION, with_region

from .shm_regions import Peer, Region, ShmRegions


@dataclass
class ShmUse:
    """The regions one request names, by the caller's names."""

    regions: dict[str, Region] = field(default_factory=dict)

    def runner_names(self) -> dict[str, str]:
        return {name: region.runner_name for name, region in self.regions.items()}

    def client_names(self) -> dict[str, str]:
        return {region.runner_name: name for name, region in self.regions.items()}


def _check_bytes_size(tensor: WireTensor, max_read: int) -> None:
    """BYTES in shared memory are read to be checked: not past the request
    size bound, and not before their size could hold the shape at all."""
    size, least = tensor.shm.byte_size, 4 * prod(tensor.shape)   # type: ignore[union-attr]  # a tensor in shared memory has its reference
    if size < least:
        raise fail(tensor.what, f"shared_memory_byte_size {size} cannot hold {prod(tensor.shape)} BYTES elements "
                                f"(each takes at least 4 bytes)")
    if size > max_read:
        raise fail(tensor.what, f"BYTES in shared memory of {size} bytes are more than server.max_request_size "
                                f"({max_read}) allows")


def attach_regions(req: InferRequest, registry: ShmRegions, peer: Peer) -> ShmUse:
    """Check every region ``req`` names; fill the data of BYTES inputs so
    their framing can be validated like any other."""
    use = ShmUse()
    for tensor in req.inputs:
        if tensor.shm is not None:
            if tensor.datatype == "BYTES":
                _check_bytes_size(tensor, registry.max_read)
            region, data = registry.check(peer, tensor.shm, tensor.what, read=tensor.datatype == "BYTES")
            if data is not None:
                tensor.data = memoryview(data)
            use.regions[region.name] = region
    for name, ref in req.shm_outputs().items():
        region, _ = registry.check(peer, ref, f"requested output {name!r}")
        use.regions[region.name] = region
    return use


def _renamed_entries(entries: Any, names: dict[str, str]) -> None:
    if type(entries) is not list:
        return
    for entry in entries:
        parameters = entry.get("parameters") if type(entry) is dict else None
        if type(parameters) is dict and parameters.get(REGION) in names:
            entry["parameters"] = with_region(parameters, names[parameters[REGION]])


def _renamed_doc(doc: dict[str, Any], names: dict[str, str]) -> bytes:
    for key in ("inputs", "outputs"):
        _renamed_entries(doc.get(key), names)
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def renamed_request(body: bytes | bytearray | memoryview, header_length: int | None,
                    use: ShmUse) -> tuple[list, int | None]:
    """The request to forward, naming regions by their runner names."""
    view = memoryview(body)
    end = len(view) if header_length is None else header_length
    header = _renamed_doc(json.loads(bytes(view[:end])), use.runner_names())
    if header_length is None:
        return [header], None
    return [header, view[end:]], len(header)


def renamed_answer(status: int, headers: dict[str, str], payload: bytes | bytearray | memoryview,
                   use: ShmUse) -> bytes | bytearray:
    """The runner's answer naming regions by the caller's names again (its
    outputs' parameters; in an error, the message). ``headers`` gets the new
    header length."""
    names = use.client_names()
    if status != 200:   # one pass: a client's region may be named like another's runner name
        text = bytes(payload).decode("utf-8", "replace")
        quoted = {repr(runner_name): json.dumps(repr(name))[1:-1] for runner_name, name in names.items()}
        pattern = re.compile("|".join(re.escape(q) for q in quoted))
        return pattern.sub(lambda m: quoted[m.group(0)], text).encode("utf-8")
    length_key = next((k for k in headers if k.lower() == HEADER_LENGTH.lower()), None)
    end = int(headers[length_key]) if length_key else len(payload)
    view = memoryview(payload)
    header = _renamed_doc(json.loads(bytes(view[:end])), names)
    if length_key is None:
        return header
    headers[length_key] = str(len(header))
    return header + bytes(view[end:]) if end < len(view) else header
