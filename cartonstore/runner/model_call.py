"""One infer request inside a runner, without the HTTP: decode the body
into numpy arrays (cartonstore.v2.framing does the wire format), call the
model, pick the requested outputs, encode the response.

Errors are split by whose fault they are: InvalidInput is the request's
(400), ModelFailed the model's (500).
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from cartonstore.errors import InvalidInput
from cartonstore.format.dtypes import carton_numpy_dtype
from cartonstore.v2.framing import (
    InferRequest,
    encode_infer_response,
    parse_infer_request,
    tensor_to_numpy,
)
from cartonstore.v2.shared_memory import RegionTooSmall, ShmRef, ShmSink
from cartonstore.v2.statistics import RequestTiming
from cartonstore.v2.validate import parse_raw_binary_for, validate_request

from .context import InferResult, Model, RunnerContext
from .declared import output_problem
from .protocol import ARENA_OUTPUTS, ARENA_REGION

if TYPE_CHECKING:
    from .shm import MappedRegions

BodyParts = list[bytes | memoryview]


class ModelFailed(Exception):
    """The model raised, or returned something that cannot be sent back."""


def decode_request(
    body: memoryview, header_length: int | None, ctx: RunnerContext, regions: MappedRegions | None = None
) -> tuple[InferRequest, dict[str, np.ndarray]]:
    """The parsed request and its inputs as numpy arrays (binary numeric
    inputs are views of ``body``, or of the shared memory in ``regions``
    they name, not copies)."""
    req = parse_raw_binary_for(body, ctx.inputs) if header_length == 0 else parse_infer_request(body, header_length)
    if any(t.shm is not None for t in req.inputs) or req.shm_outputs():
        if regions is None:
            raise InvalidInput("this runner takes no shared memory tensors", subject="shared_memory")
        for tensor in req.inputs:
            if tensor.shm is not None:
                tensor.data = regions.input_bytes(tensor.shm, tensor.what)
        for name, ref in req.shm_outputs().items():   # an unknown region is refused before the model runs
            regions.check(ref, f"requested output {name!r}")
    arena = arena_outputs(req)
    if arena is not None:
        if regions is None:
            raise InvalidInput("this runner has no tensor arena", subject=ARENA_OUTPUTS)
        regions.check(arena, ARENA_OUTPUTS)
    # The structural checks (duplicates, data that fills its shape, known
    # outputs); datatypes and shapes are the model's to refuse, as with any
    # v2 server: the daemon checks those against carton.toml before forwarding.
    validate_request(req, None, ctx.outputs)
    return req, {tensor.name: tensor_to_numpy(tensor) for tensor in req.inputs}


def arena_outputs(req: InferRequest) -> ShmRef | None:
    """The span of the daemon's tensor arena the request gives binary
    outputs (ARENA_OUTPUTS), or None."""
    given = req.parameters.get(ARENA_OUTPUTS)
    if given is None:
        return None
    offset = given.get("offset") if type(given) is dict else None
    size = given.get("byte_size") if type(given) is dict else None
    if type(offset) is not int or type(size) is not int or offset < 0 or size < 0:
        raise InvalidInput(f'{ARENA_OUTPUTS} must be {{"offset": int >= 0, "byte_size": int >= 0}}, not {given!r}',
                           subject=ARENA_OUTPUTS)
    return ShmRef(ARENA_REGION, offset, size)


_ARENA_KINDS = frozenset("biuf")   # numpy kinds whose binary form is exactly their nbytes
_ARENA_ALIGN = 64


def _output_sinks(req: InferRequest, regions: MappedRegions | None,
                  selected: Mapping[str, np.ndarray]) -> dict[str, ShmSink]:
    """Where outputs go instead of the answer's body (close them after):
    those requested in shared memory, then binary numeric ones that fit
    into the arena span the daemon gave; the rest go in the body."""
    sinks: dict[str, ShmSink] = {}
    if regions is None:
        return sinks
    try:
        for name, ref in req.shm_outputs().items():
            sinks[name] = regions.sink(ref, f"requested output {name!r}")
        arena = arena_outputs(req)
        if arena is not None:
            at = arena.offset
            for name, array in selected.items():
                if name in sinks or array.dtype.kind not in _ARENA_KINDS or not req.wants_binary(name):
                    continue
                if at + array.nbytes > arena.end:
                    continue
                sinks[name] = regions.arena_sink(at, array.nbytes)
                at += -(-array.nbytes // _ARENA_ALIGN) * _ARENA_ALIGN
    except BaseException:
        _close(sinks)
        raise
    return sinks


def _close(sinks: dict[str, ShmSink]) -> None:
    for sink in sinks.values():
        sink.close()


def run_and_encode(
    model: Model,
    ctx: RunnerContext,
    req: InferRequest,
    inputs: dict[str, np.ndarray],
    timing: RequestTiming,
    queued_ns: int,
    regions: MappedRegions | None = None,
) -> tuple[BodyParts, int | None]:
    """Call the model and encode its answer (runs in the thread that read
    the request, as the model does). Outputs requested in
    shared memory are written into ``regions``; RegionTooSmall when one
    does not fit. ``timing`` gets the queue, model and encoding times."""
    started = time.monotonic_ns()
    timing.queue_ns = started - queued_ns
    parameters = dict(req.parameters)
    parameters.pop(ARENA_OUTPUTS, None)   # the daemon's, not the model's
    try:
        result = model.infer(inputs, parameters)
    except Exception as exc:  # noqa: BLE001 - whatever the model raised is its failure, said to the caller
        traceback.print_exc(file=sys.stderr)
        raise ModelFailed(f"{type(exc).__name__}: {exc}") from None
    finally:
        encoding = time.monotonic_ns()
        timing.infer_ns = encoding - started
    selected, parameters = checked_outputs(result, req, ctx)
    sinks = _output_sinks(req, regions, selected)   # looked up again: an object may have shrunk meanwhile
    try:
        return encode_infer_response(
            model_name=ctx.name,
            model_version=ctx.version,
            request_id=req.id,
            outputs=selected,
            binary=req.wants_binary,
            parameters=parameters,
            sinks=sinks,
        )
    except RegionTooSmall:
        raise
    except InvalidInput as exc:
        raise ModelFailed(f"cannot send the model's outputs: {exc.message}") from None
    finally:
        _close(sinks)
        timing.output_ns = time.monotonic_ns() - encoding


def checked_outputs(result: Any, req: InferRequest, ctx: RunnerContext) -> tuple[dict[str, np.ndarray],
                                                                                  dict[str, Any]]:
    """What the model returned for ``req``: the requested outputs as
    arrays, checked against carton.toml's declarations, and the response
    parameters; ModelFailed naming what is wrong."""
    outputs, parameters = split_result(result)
    declared = ctx.declared_outputs
    selected = _select_outputs(outputs, req, declared)
    if declared is not None:   # what metadata announces is what responses carry
        for name, value in selected.items():
            problem = output_problem(name, value, declared)
            if problem is not None:
                raise ModelFailed(problem)
    return selected, parameters


def split_result(result: Any) -> tuple[Mapping[str, Any], dict[str, Any]]:
    """What Model.infer returned: (outputs by name, response parameters);
    ModelFailed for anything but a dict of string names (or an InferResult)."""
    if isinstance(result, InferResult):
        outputs, parameters = result.outputs, dict(result.parameters)
    else:
        outputs, parameters = result, {}
    if not isinstance(outputs, Mapping):
        raise ModelFailed(f"the model returned {type(outputs).__name__}, not a dict of output name to tensor")
    for name in outputs:
        if not isinstance(name, str):
            raise ModelFailed(f"the model returned an output named {name!r}; output names must be strings")
    return outputs, parameters


def _select_outputs(outputs: Mapping[str, Any], req: InferRequest,
                    declared: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The requested outputs (all when none is named), as arrays. A value
    that is not an array (a list, a Python number) has no dtype of its own:
    it takes the declared one."""
    names = list(outputs) if req.outputs is None else [o.name for o in req.outputs]
    selected: dict[str, np.ndarray] = {}
    for name in names:
        if name not in outputs:
            raise ModelFailed(
                f"the model returned no output {name!r} (it returned: {', '.join(outputs) or 'nothing'})"
            )
        value = outputs[name]
        try:
            spec = (declared or {}).get(name)
            selected[name] = value if isinstance(value, np.ndarray) else _plain_array(value, spec)
        except Exception as exc:  # noqa: BLE001 - any odd object the model returned
            raise ModelFailed(f"output {name!r} is not a tensor: {type(exc).__name__}: {exc}") from None
    return selected


def _plain_array(value: Any, spec: Any) -> np.ndarray:
    """A list or Python number as an array of the declared dtype when its
    values are of that kind and fit it exactly (ints that fit int32, floats
    for float32); else as numpy reads it, for output_problem to refuse:
    floats are never cut to integers, nor big integers wrapped."""
    array = np.asarray(value)
    if spec is None or spec.dtype == "string" or array.dtype.kind not in "biuf":
        return array
    dtype = carton_numpy_dtype(spec.dtype)
    if array.dtype.kind == "f" and dtype.kind != "f":
        return array   # floats are never cut to integers (not cast at all: NaN would warn)
    with np.errstate(over="ignore"):
        cast = array.astype(dtype)
    if array.dtype.kind == "f":
        # a Python float is a double: a float32 output takes it rounded, but not overflowed to infinity
        return array if np.any(np.isinf(cast) & np.isfinite(array)) else cast
    return cast if np.array_equal(cast, array) else array
