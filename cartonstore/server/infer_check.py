"""Checking an infer request against a model's declared tensors, and what
to forward to its runner: pure (no daemon state), so the daemon runs it on
its loop, in a thread, or in a check worker process (check_worker.py).
Requests that name shared memory need the daemon's region registry: they
are parsed here and finished in infer_api."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidInput
from ..format.carton_toml import TensorSpec
from ..v2.binary_form import binary_form
from ..v2.framing import InferRequest, parse_infer_request
from ..v2.shm_params import ARENA_OUTPUTS
from ..v2.validate import validate_request

Forward = tuple[list, "int | None"]   # body parts, Inference-Header-Content-Length (None: all JSON)


def parsed_request(body: bytes | bytearray | memoryview, header_length: int | None) -> InferRequest:
    """The request's structure; a 400 for one that uses what is the daemon's alone to say."""
    req = parse_infer_request(body, header_length)
    if ARENA_OUTPUTS in req.parameters:   # it tells a runner where to write: the daemon's alone to give
        raise InvalidInput(f"infer request: parameter {ARENA_OUTPUTS!r} is reserved for the daemon",
                           subject=ARENA_OUTPUTS)
    return req


def uses_shm(req: InferRequest) -> bool:
    return any(t.shm is not None for t in req.inputs) or bool(req.shm_outputs())


def checked_unless_shm(body: bytes | bytearray | memoryview, header_length: int | None,
                       inputs: Sequence[TensorSpec] | None,
                       outputs: Sequence[TensorSpec] | None) -> tuple[InferRequest, Forward | None]:
    """Parse; then, unless the request names shared memory (None: the
    daemon's region registry finishes it), validate and say what to forward."""
    req = parsed_request(body, header_length)
    if uses_shm(req):
        return req, None
    return req, checked_forward(req, inputs, outputs, body, header_length)


def checked_forward(req: InferRequest, inputs: Sequence[TensorSpec] | None, outputs: Sequence[TensorSpec] | None,
                    body: bytes | bytearray | memoryview, header_length: int | None) -> Forward:
    """Validate ``req`` (which names no shared memory); what to send its
    runner: JSON data inputs as binary data (binary_form), else the body
    as it came."""
    validate_request(req, inputs, outputs)
    rewritten = binary_form(req)
    if rewritten is not None:
        return rewritten
    return [body], header_length
