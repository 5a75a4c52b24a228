"""Triton's protocol extensions as every door offers them: the list the
server's metadata names, and what the shared-memory extensions do beyond
the region registry (server/tensors/shm_regions.py).

cartonstore does not map CUDA IPC handles yet: status answers that no
region is registered and unregister that nothing is left (clients call it
first to start clean, so the system shared-memory examples run), while
register checks the request and then refuses it saying why, naming the
GPUs the runners have or that there are none.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from cartonstore.errors import InvalidInput
from cartonstore.server.tensors.shm_regions import Region

EXTENSIONS = ["binary_tensor_data", "model_repository", "system_shared_memory", "cuda_shared_memory",
              "statistics", "model_configuration", "cartonstore_leases", "cartonstore_blobs"]


def tell_runners(gone: list[Region]) -> None:
    """The runners that map unregistered regions let them go."""
    for region in gone:
        for link in list(region.links):
            link.forget(region)


def cuda_register_problem(doc: Any, name: str, devices: tuple[str, ...]) -> str:
    """Why a register request is refused: what is malformed in it, else
    why this daemon cannot map it."""
    if not isinstance(doc, dict):
        return "the register request must be a JSON object"
    unknown = sorted(set(doc) - {"raw_handle", "device_id", "byte_size"})
    if unknown:
        return f"unknown field(s) in the register request: {', '.join(unknown)}"
    handle = doc.get("raw_handle")
    b64 = handle.get("b64") if isinstance(handle, dict) else None
    if not isinstance(b64, str):
        return "'raw_handle' must be {\"b64\": <the base64 cudaIpcMemHandle_t>}"
    try:
        base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return "'raw_handle.b64' is not valid base64"
    for key in ("device_id", "byte_size"):
        value = doc.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"{key!r} must be an integer >= 0, not {value!r}"
    gpus = [d for d in devices if d.startswith("cuda:")]
    if not gpus:
        return (f"cannot register CUDA shared memory region {name!r}: this daemon's runners have no GPU "
                f"(runners.devices is {', '.join(devices)}); use system shared memory")
    return (f"cannot register CUDA shared memory region {name!r}: cartonstore does not map CUDA IPC handles "
            f"into its runners yet (GPUs: {', '.join(gpus)}); use system shared memory")


def cuda_status_answer(name: str | None) -> list[dict[str, Any]]:
    if name is not None:
        raise InvalidInput(f"Unable to find cuda shared memory region: {name!r}", subject=name)
    return []
