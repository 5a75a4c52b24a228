"""Checking an infer request against a model's declared tensors, and what
to forward to its runner: pure (no daemon state), so the daemon runs it on
its loop, in a thread, or in a check worker process (server/checks/worker.py).
Requests that name shared memory need the daemon's region registry: they
are parsed here and finished in server/inference/checks.py."""

from __future__ import annotations

from collections.abc import Sequence

from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import TensorSpec
from cartonstore.runner.protocol import ARENA_OUTPUTS
from cartonstore.v2.binary_form import binary_form
from cartonstore.v2.framing import InferRequest, parse_infer_request
from cartonstore.v2.validate import validate_request

Forward = tuple[list, "int | None"]   # body parts, Inference-Header-Content-Length (None: all JSON)


def checked_unless_shm(body: bytes | bytearray | memoryview, header_length: int | None,
                       inputs: Sequence[TensorSpec] | None,
                       outputs: Sequence[TensorSpec] | None) -> tuple[InferRequest, Forward | None]:
    """Parse; then, unless the request names shared memory (None: the
    daemon's region registry finishes it), validate and say what to send
    its runner: JSON data inputs as binary data (binary_form), else the
    body as it came. A 400 for a bad request, and for one that uses what
    is the daemon's alone to say."""
    req = parse_infer_request(body, header_length)
    if ARENA_OUTPUTS in req.parameters:   # it tells a runner where to write: the daemon's alone to give
        raise InvalidInput(f"infer request: parameter {ARENA_OUTPUTS!r} is reserved for the daemon",
                           subject=ARENA_OUTPUTS)
    if any(t.shm is not None for t in req.inputs) or req.shm_outputs():
        return req, None
    validate_request(req, inputs, outputs)
    return req, binary_form(req) or ([body], header_length)
