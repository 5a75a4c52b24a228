"""Check a parsed infer request against a carton's declared inputs and
outputs before it is forwarded to a runner.

This runs on the daemon's event loop for every request, so it does no numpy
work: binary numeric tensors are checked by size arithmetic alone, BYTES
framing is walked with struct.unpack_from, and JSON data is checked by
element type and count.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import TensorSpec
from cartonstore.format.dtypes import carton_dtype_to_v2, shape_to_v2_dims

from .datatypes import ELEMENT_SIZES
from .elements import (
    check_bytes_framing,
    check_json_data,
    check_numeric_size,
    fail,
    shape_text,
)
from .framing import (
    HEADER_LENGTH,
    InferRequest,
    WireTensor,
    parse_raw_binary_request,
)
from .shared_memory import BYTE_SIZE

# A spec dimension or whole shape that matches anything.
ANY = "*"


def validate_request(
    req: InferRequest,
    inputs: Sequence[TensorSpec] | None,
    outputs: Sequence[TensorSpec] | None,
) -> None:
    """Raise InvalidInput, naming the input, for anything the model would
    refuse: unknown, missing or duplicate inputs, wrong datatypes, shapes
    that break the declared dims or bind a symbol to two values, tensor data
    that does not fill the shape, and requested outputs the model lacks.

    ``inputs``/``outputs`` None means the carton declares none: only the
    checks that need no declaration are made.
    """
    by_name = None if inputs is None else {spec.name: spec for spec in inputs}
    # symbol -> (value, input that bound it): a dimension symbol binds an
    # int, a whole-shape symbol binds the shape tuple.
    bindings: dict[str, tuple[Any, str]] = {}
    seen: set[str] = set()
    for tensor in req.inputs:
        spec = _declared(tensor, seen, by_name, inputs)
        if spec is not None:
            _check_against_spec(tensor, spec, bindings)
        check_tensor_data(tensor)
    if inputs is not None and len(seen) != len(inputs):
        missing = [spec.name for spec in inputs if spec.name not in seen]
        raise InvalidInput(
            f"input {missing[0]!r} is missing (the model needs {_names(inputs)})", subject=missing[0]
        )
    for requested in req.outputs or ():
        if "classification" in requested.parameters:   # Triton would answer top-k labels; a runner, the tensor
            raise InvalidInput(f"requested output {requested.name!r}: Triton's classification extension "
                               f"(parameter 'classification') is not supported by cartonstore",
                               subject=requested.name)
    if outputs is not None and req.outputs is not None:
        declared = {spec.name for spec in outputs}
        for requested in req.outputs:
            if requested.name not in declared:
                raise InvalidInput(
                    f"requested output {requested.name!r} is not an output of this model "
                    f"(outputs: {_names(outputs)})",
                    subject=requested.name,
                )


def validate_answer(found: Sequence[WireTensor], outputs: Sequence[TensorSpec] | None) -> None:
    """Raise InvalidInput, naming the output, for an answer the model's
    declared ``outputs`` do not allow: an output given twice or not
    declared, another datatype, a shape of another rank or other fixed
    dimensions, data that does not fill its shape. Symbols match any size
    (an output's may follow from the request's inputs). Outputs in shared
    memory are checked by their byte_size (BYTES there by nobody: their
    bytes are the client's to read). None: the model declares no outputs,
    so only the answer's own consistency is checked."""
    by_name = None if outputs is None else {spec.name: spec for spec in outputs}
    seen: set[str] = set()
    for tensor in found:
        spec = _declared(tensor, seen, by_name, outputs)
        if spec is not None:
            _check_against_spec(tensor, spec, {}, bind=False)
        if tensor.data is None and tensor.shm is not None and tensor.datatype == "BYTES":
            continue
        check_tensor_data(tensor)


def _declared(tensor: WireTensor, seen: set[str], by_name: dict[str, TensorSpec] | None,
              specs: Sequence[TensorSpec] | None) -> TensorSpec | None:
    """The spec ``tensor`` (an input or an output) answers to, None where
    the model declares none; InvalidInput for one given twice (``seen``:
    the names before it) or not declared."""
    if tensor.name in seen:
        raise fail(tensor.what, "is given twice")
    seen.add(tensor.name)
    if by_name is None:
        return None
    spec = by_name.get(tensor.name)
    if spec is None:
        raise fail(tensor.what, f"is not an {tensor.role} of this model ({tensor.role}s: {_names(specs or ())})")
    return spec


def check_tensor_data(tensor: WireTensor) -> None:
    """The tensor's data fills its shape exactly, in its datatype (JSON
    data is left flattened, in row-major order)."""
    datatype = tensor.datatype
    data = tensor.data
    if data is None and tensor.shm is not None:
        # Its bytes are in shared memory nobody here has read: numeric data
        # is checked by size. BYTES need their framing walked, so whoever
        # holds the region fills ``data`` first (read_bytes_inputs).
        if datatype == "BYTES":
            raise fail(tensor.what, "BYTES in shared memory must be read before they are checked")
        check_numeric_size(tensor.what, datatype, tensor.shape, tensor.shm.byte_size, BYTE_SIZE)
    elif data is None:
        # Kept flat: what binary_form sends needs no second walk.
        tensor.json_data = check_json_data(tensor.what, datatype, tensor.shape, tensor.json_data,
                                           numbers_only=tensor.json_numbers)
    elif datatype == "BYTES":
        check_bytes_framing(tensor.what, tensor.shape, data)
    elif len(data) != prod(tensor.shape) * ELEMENT_SIZES[datatype]:  # type: ignore[operator]  # a numeric datatype has a size; shape checked ints
        check_numeric_size(tensor.what, datatype, tensor.shape, len(data))


def _check_against_spec(tensor: WireTensor, spec: TensorSpec, bindings: dict[str, tuple[Any, str]], *,
                        bind: bool = True) -> None:
    expected = carton_dtype_to_v2(spec.dtype)
    if tensor.datatype != expected:
        raise fail(tensor.what, f"datatype is {tensor.datatype} but the model expects {expected}")
    _check_shape(tensor, spec, bindings, bind)


def _check_shape(tensor: WireTensor, spec: TensorSpec, bindings: dict[str, tuple[Any, str]], bind: bool) -> None:
    declared = spec.shape
    shape = tensor.shape
    if declared is None or declared == ANY:
        return
    if isinstance(declared, str):
        if bind:
            _bind(tensor, declared, tuple(shape), bindings, None)
        return
    if len(shape) != len(declared):
        raise fail(
            tensor.what,
            f"shape {shape_text(shape)} has rank {len(shape)} but the model expects rank "
            f"{len(declared)} ({_spec_text(declared)})",
        )
    for index, want in enumerate(declared):
        dim = shape[index]
        if type(want) is int:
            if dim != want:
                raise fail(
                    tensor.what,
                    f"shape {shape_text(shape)} has {dim} in dimension {index} but the model "
                    f"expects {want} ({_spec_text(declared)})",
                )
        elif want != ANY and bind:
            _bind(tensor, want, dim, bindings, index)  # type: ignore[arg-type]  # not an int: a symbol


def _bind(
    tensor: WireTensor, symbol: str, value: Any, bindings: dict[str, tuple[Any, str]], index: int | None
) -> None:
    bound = bindings.get(symbol)
    if bound is None:
        bindings[symbol] = (value, tensor.name)
    elif bound[0] != value:
        where = f"shape {shape_text(tensor.shape)}"
        if index is not None:
            where = f"dimension {index} of {where}"
        raise fail(
            tensor.what,
            f"symbol {symbol!r} is {_value_text(value)} in {where} but "
            f"{_value_text(bound[0])} in input {bound[1]!r}",
        )


def _value_text(value: Any) -> str:
    return shape_text(list(value)) if isinstance(value, tuple) else str(value)


def _spec_text(declared: Sequence[int | str]) -> str:
    return "[" + ", ".join(str(d) for d in declared) + "]"


def _names(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(repr(spec.name) for spec in specs) or "none"


def parse_raw_binary_for(body: bytes | bytearray | memoryview, inputs: Sequence[TensorSpec] | None) -> InferRequest:
    """A raw binary request (header length 0) for a model declaring inputs:
    only a model with exactly one input can take one."""
    if inputs is None or len(inputs) != 1:
        count = "declares no inputs" if inputs is None else f"has {len(inputs)} inputs"
        raise InvalidInput(f"a raw binary request ({HEADER_LENGTH}: 0) needs a model with exactly one input; "
                           f"this model {count}", subject=HEADER_LENGTH)
    spec = inputs[0]
    return parse_raw_binary_request(body, input_name=spec.name, datatype=carton_dtype_to_v2(spec.dtype),
                                    dims=shape_to_v2_dims(spec.shape))
