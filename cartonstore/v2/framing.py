"""KServe v2 inference bodies with Triton's binary tensor data extension
(https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md),
in both directions.

A body is a JSON object, optionally followed by the raw bytes of the tensors
that carry a "binary_data_size" parameter, in the order those tensors appear
in the JSON; the Inference-Header-Content-Length header gives the JSON's
length. Binary tensor bytes are never copied while parsing: tensors hold
memoryview slices of the body and decode with np.frombuffer.
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np

from cartonstore.errors import InvalidInput

from . import json_codec
from .datatypes import ELEMENT_SIZES, check_datatype
from .elements import check_numeric_size, fail

# Encoding (encode.py) and the numpy side of tensors (tensors.py) are
# re-exported here so callers find the whole wire format in one place.
from .encode import encode_infer_request, encode_infer_response
from .shared_memory import shm_ref
from .tensors import numpy_to_binary, numpy_to_json_data, tensor_to_numpy
from .wire_types import InferRequest, RequestedOutput, WireTensor

HEADER_LENGTH = "Inference-Header-Content-Length"


def _split_body(
    body: bytes | bytearray | memoryview, header_length: int | None, what: str
) -> tuple[dict[str, Any], memoryview | None, frozenset[int]]:
    """The JSON object, the binary part after it (None when all JSON), and
    the ids of the object's arrays of numbers alone."""
    if header_length is None:
        raw = body.tobytes() if isinstance(body, memoryview) else body
        doc, numbers = _load_json(raw, what)
        return doc, None, numbers
    if type(header_length) is not int or header_length <= 0:
        raise InvalidInput(
            f"{what}: {HEADER_LENGTH} must be a positive integer here, not {header_length!r}",
            subject=HEADER_LENGTH,
        )
    view = _byte_view(body)
    if header_length > len(view):
        raise InvalidInput(
            f"{what}: {HEADER_LENGTH} {header_length} is larger than the {len(view)}-byte body",
            subject=HEADER_LENGTH,
        )
    doc, numbers = _load_json(view[:header_length].tobytes(), what)
    return doc, view[header_length:], numbers


def _byte_view(body: bytes | bytearray | memoryview) -> memoryview:
    view = body if isinstance(body, memoryview) else memoryview(body)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _load_json(raw: bytes | bytearray, what: str) -> tuple[dict[str, Any], frozenset[int]]:
    """The JSON object, and the ids of its arrays of numbers alone (json_codec)."""
    try:
        doc, numbers = json_codec.loads_noting_numbers(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"{what}: JSON is not valid: {exc}", subject=what) from None
    if type(doc) is not dict:
        raise InvalidInput(f"{what}: JSON must be an object", subject=what)
    return doc, numbers


def _is_dims(shape: list[Any]) -> bool:
    return all(type(dim) is int and dim >= 0 for dim in shape)


def _named_entry(entry: Any, index: int, role: str) -> tuple[str, dict[str, Any]]:
    """The name and parameters of one tensor or requested output object."""
    if type(entry) is not dict:
        raise fail(f"{role} #{index}", "must be a JSON object")
    name = entry.get("name")
    if type(name) is not str or not name:
        raise fail(f"{role} #{index}", f'"name" must be a non-empty string, not {name!r}')
    parameters = entry.get("parameters")
    if parameters is None:
        return name, {}
    if type(parameters) is not dict:
        raise fail(f"{role} {name!r}", '"parameters" must be a JSON object')
    return name, parameters


def _parse_tensors(entries: Any, binary: memoryview | None, role: str,
                   numbers: frozenset[int] = frozenset()) -> list[WireTensor]:
    if type(entries) is not list:
        raise InvalidInput(f'"{role}s" must be a JSON array', subject=role)
    tensors: list[WireTensor] = []
    offset = 0
    for index, entry in enumerate(entries):
        name, parameters = _named_entry(entry, index, role)
        datatype = entry.get("datatype")
        if type(datatype) is not str or datatype not in ELEMENT_SIZES:  # a list is unhashable
            check_datatype(datatype, f"{role} {name!r}")
        shape = entry.get("shape")
        if type(shape) is not list or not _is_dims(shape):
            raise fail(f"{role} {name!r}", f'"shape" must be an array of integers >= 0, not {shape!r}')
        shm = shm_ref(parameters, f"{role} {name!r}")
        if shm is not None:
            if "data" in entry or "binary_data_size" in parameters:
                given = '"data"' if "data" in entry else "binary_data_size"
                raise fail(f"{role} {name!r}", f"names a shared memory region and also has {given}")
            tensors.append(WireTensor(name, datatype, shape, parameters, None, None, role, shm))
            continue
        size = parameters.get("binary_data_size")
        if size is None:
            if "data" not in entry:
                raise fail(f"{role} {name!r}", 'has neither "data" nor a "binary_data_size" parameter')
            data = entry["data"]
            if type(data) is not list:
                raise fail(f"{role} {name!r}", '"data" must be a JSON array')
            tensors.append(WireTensor(name, datatype, shape, parameters, None, data, role,
                                      json_numbers=id(data) in numbers))
            continue
        if type(size) is not int or size < 0:
            raise fail(f"{role} {name!r}", f"binary_data_size must be an integer >= 0, not {size!r}")
        if "data" in entry:
            raise fail(f"{role} {name!r}", 'has both "data" and a "binary_data_size" parameter')
        if binary is None:
            raise fail(
                f"{role} {name!r}",
                f"binary_data_size {size} given but the body is all JSON "
                f"(no {HEADER_LENGTH} header)",
            )
        end = offset + size
        if end > len(binary):
            raise fail(
                f"{role} {name!r}",
                f"binary_data_size {size} runs past the end of the body: bytes {offset}..{end} "
                f"of a {len(binary)}-byte binary part",
            )
        tensors.append(WireTensor(name, datatype, shape, parameters, binary[offset:end], None, role))
        offset = end
    if binary is not None and offset != len(binary):
        raise InvalidInput(
            f"body has {len(binary) - offset} bytes after the binary data of the {role}s "
            f"(binary_data_size values add up to {offset} of {len(binary)} binary bytes)",
            subject=role,
        )
    return tensors


def _parse_requested_outputs(entries: Any) -> list[RequestedOutput] | None:
    if entries is None:
        return None
    if type(entries) is not list:
        raise InvalidInput('"outputs" must be a JSON array', subject="outputs")
    if not entries:  # Triton returns every output when none is named
        return None
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        name, parameters = _named_entry(entry, index, "requested output")
        if name in seen:
            raise fail(f"requested output {name!r}", "is requested twice")
        seen.add(name)
        binary = parameters.get("binary_data")
        if binary is not None and type(binary) is not bool:
            raise fail(f"requested output {name!r}", f"binary_data must be true or false, not {binary!r}")
        outputs.append(RequestedOutput(name, binary, parameters, shm_ref(parameters, f"requested output {name!r}")))
    return outputs


def header_length(value: str | None) -> int | None:
    """The Inference-Header-Content-Length header as a number; None when absent."""
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()):  # str.isdigit alone takes "²", which int() refuses
        raise InvalidInput(f"{HEADER_LENGTH} must be a whole number of bytes, got {value!r}", subject=HEADER_LENGTH)
    return int(text)


def parse_infer_request(body: bytes | bytearray | memoryview, header_length: int | None) -> InferRequest:
    """Parse an infer request body (structure only; see validate.py for the
    checks against a model's declared tensors).

    ``header_length`` is the Inference-Header-Content-Length header: None when
    the whole body is JSON, > 0 for JSON followed by binary tensor data. 0
    (a raw binary request) is the caller's to route to parse_raw_binary_request.
    """
    doc, binary, numbers = _split_body(body, header_length, "infer request")
    request_id = doc.get("id")
    if request_id is not None and type(request_id) is not str:
        raise InvalidInput(f'infer request: "id" must be a string, not {request_id!r}', subject="id")
    parameters = doc.get("parameters")
    if parameters is None:
        parameters = {}
    elif type(parameters) is not dict:
        raise InvalidInput('infer request: "parameters" must be a JSON object', subject="parameters")
    binary_output = parameters.get("binary_data_output", False)
    if type(binary_output) is not bool:
        raise InvalidInput(
            f"infer request: binary_data_output must be true or false, not {binary_output!r}",
            subject="binary_data_output",
        )
    if "inputs" not in doc:
        raise InvalidInput('infer request: "inputs" is missing', subject="inputs")
    inputs = _parse_tensors(doc["inputs"], binary, "input", numbers)
    outputs = _parse_requested_outputs(doc.get("outputs"))
    return InferRequest(request_id, inputs, outputs, parameters, binary_output, doc)


def parse_raw_binary_request(
    body: bytes | bytearray | memoryview, *, input_name: str, datatype: str, dims: list[int]
) -> InferRequest:
    """A raw binary request (Inference-Header-Content-Length: 0): the body is
    the bytes of the model's one input, whose shape follows from ``dims`` (the
    model's v2 dims, -1 for a variable one) and the byte size. Every output
    comes back binary.
    """
    what = f"input {input_name!r}"
    check_datatype(datatype, what)
    view = _byte_view(body)
    size = len(view)
    if datatype == "BYTES":
        # A raw BYTES body is one element without its length prefix (Triton
        # prepends it); it is added here so the tensor reads like any binary
        # BYTES tensor. Like Triton, any fixed shape of one element will do.
        if any(type(d) is not int or d < 0 for d in dims) or prod(dims) != 1:
            raise fail(
                what, f"a raw binary BYTES request needs the input's shape to be [1], not {list(dims)}"
            )
        if size >= 2**32:
            raise fail(what, f"a BYTES element of {size} bytes is too large (limit 4 GiB - 1)")
        framed = memoryview(size.to_bytes(4, "little") + view.tobytes())
        tensor = WireTensor(input_name, datatype, list(dims), {"binary_data_size": size + 4}, framed)
        return InferRequest(None, [tensor], None, {}, True)
    shape = _deduce_raw_shape(what, datatype, dims, size)
    tensor = WireTensor(input_name, datatype, shape, {"binary_data_size": size}, view)
    return InferRequest(None, [tensor], None, {}, True)


def _deduce_raw_shape(what: str, datatype: str, dims: list[int], size: int) -> list[int]:
    if any(type(d) is not int or d < -1 for d in dims):
        raise fail(what, f"dims must be integers >= -1, not {dims}")
    variable = [i for i, d in enumerate(dims) if d == -1]
    if len(variable) > 1:
        raise fail(
            what,
            f"a raw binary request needs at most one variable dimension, but dims {dims} "
            f"have {len(variable)}; send a JSON header instead",
        )
    element = ELEMENT_SIZES[datatype]
    assert element is not None
    fixed = 1
    for d in dims:
        if d != -1:
            fixed *= d
    shape = list(dims)
    if variable:
        unit = fixed * element
        if unit == 0 or size % unit:
            raise fail(
                what,
                f"raw binary data of {size} bytes does not fit dims {dims} of {datatype} "
                f"(not a multiple of {unit} bytes)",
            )
        shape[variable[0]] = size // unit
    check_numeric_size(what, datatype, shape, size)
    return shape


def surely_plain(header: bytes | bytearray, *marks: bytes) -> bool:
    """Whether a JSON header surely holds none of ``marks`` (b'"BYTES"', a
    parameter's name): it does not spell them, nor holds an escape that
    could. What decides whether a body is walked on the event loop."""
    return b"\\" not in header and not any(mark in header for mark in marks)


def parse_infer_answer(body: bytes | bytearray | memoryview,
                       header_length: int | None) -> tuple[dict[str, Any], list[WireTensor]]:
    """An infer response's JSON and its outputs, structure only: nothing
    decoded (see validate.validate_answer for the checks against a model's
    declared outputs)."""
    doc, binary, numbers = _split_body(body, header_length, "infer response")
    if "outputs" not in doc:
        raise InvalidInput('infer response: "outputs" is missing', subject="outputs")
    return doc, _parse_tensors(doc["outputs"], binary, "output", numbers)


def parse_infer_response(
    body: bytes | bytearray | memoryview, header_length: int | None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The response JSON and its outputs decoded to numpy arrays."""
    doc, binary, _numbers = _split_body(body, header_length, "infer response")
    tensors = _parse_tensors(doc.get("outputs", []), binary, "output")
    arrays: dict[str, np.ndarray] = {}
    for tensor in tensors:
        if tensor.name in arrays:
            raise fail(tensor.what, "appears twice in the response")
        if tensor.shm is None:  # one in shared memory is read from there by the caller
            arrays[tensor.name] = tensor_to_numpy(tensor)
    return doc, arrays


__all__ = [
    "HEADER_LENGTH", "InferRequest", "RequestedOutput", "WireTensor", "encode_infer_request",
    "encode_infer_response", "numpy_to_binary", "numpy_to_json_data", "parse_infer_answer", "parse_infer_request",
    "parse_infer_response", "parse_raw_binary_request", "surely_plain", "tensor_to_numpy",
]
