"""A decoupled model's many responses to one request, as the frames of
protocol.py's section 12: the model's ``infer_stream`` is iterated in the
thread that read the request, and each response it yields is encoded (its
outputs binary, checked as one answer's are) and written before the next
is asked for, so a reader that does not read stops the model at its yield.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from cartonstore.errors import InvalidInput
from cartonstore.v2.encode import encode_infer_response
from cartonstore.v2.framing import InferRequest

from .context import RunnerContext
from .model_call import BodyParts, ModelFailed, checked_outputs
from .protocol import ARENA_OUTPUTS, FINAL_PARAMETER, STREAM_FRAME

StreamCall = Callable[[dict[str, np.ndarray], dict[str, Any]], Iterator[Any]]


def stream_call(model: object) -> StreamCall | None:
    """The model's ``infer_stream(inputs, parameters)``, when it has one: it is decoupled."""
    call = getattr(model, "infer_stream", None)
    return call if callable(call) else None


def frame(parts: BodyParts, header_length: int) -> BodyParts:
    """One response's frame: STREAM_FRAME, then ``parts`` (its JSON header's
    ``header_length`` bytes, then its binary data)."""
    total = sum(memoryview(p).nbytes for p in parts)
    return [STREAM_FRAME.pack(header_length, total - header_length), *parts]


def _final(ctx: RunnerContext, req: InferRequest, error: str | None) -> BodyParts:
    doc: dict[str, Any] = {"error": error} if error is not None else {
        "model_name": ctx.name, "model_version": ctx.version, "outputs": []}
    if req.id is not None and error is None:
        doc["id"] = req.id
    doc["parameters"] = {FINAL_PARAMETER: True}
    header = json.dumps(doc).encode()
    return frame([header], len(header))


def stream_frames(call: StreamCall, ctx: RunnerContext, req: InferRequest,
                  inputs: dict[str, np.ndarray]) -> Iterator[BodyParts]:
    """Each response ``call`` yields as a frame, then the final frame (an
    error frame when the model raised or yielded what cannot be sent)."""
    parameters = dict(req.parameters)
    parameters.pop(ARENA_OUTPUTS, None)   # the daemon's, not the model's
    error = None
    try:
        for result in call(inputs, parameters):
            selected, out_parameters = checked_outputs(result, req, ctx)
            out_parameters[FINAL_PARAMETER] = False
            try:
                parts, length = encode_infer_response(
                    model_name=ctx.name, model_version=ctx.version, request_id=req.id, outputs=selected,
                    binary=lambda name: True, parameters=out_parameters)
            except InvalidInput as exc:
                raise ModelFailed(f"cannot send the model's outputs: {exc.message}") from None
            # no output at all (length None): the JSON header alone
            yield frame(parts, length if length is not None else sum(memoryview(p).nbytes for p in parts))
    except ModelFailed as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 - whatever the model raised ends its stream, said to the caller
        traceback.print_exc(file=sys.stderr)
        error = f"{type(exc).__name__}: {exc}"
    yield _final(ctx, req, error)
