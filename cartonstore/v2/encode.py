"""Encoding KServe v2 infer requests and responses with Triton's binary
tensor data extension: a JSON header, then the bytes of the tensors sent
binary (contiguous arrays are not copied: the parts are views of them).
Outputs requested in shared memory are written there instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cartonstore.errors import InvalidInput

from . import json_codec
from .datatypes import BINARY_ONLY_DATATYPES, datatype_of
from .elements import fail
from .shared_memory import BYTE_SIZE, OFFSET, REGION, RegionTooSmall, ShmSink
from .tensors import json_value, tensor_to_numpy, to_binary
from .wire_types import WireTensor


def _encode_tensors(
    arrays: Mapping[str, np.ndarray],
    role: str,
    binary: Callable[[str], bool],
    chunks: list[bytes | memoryview],
    sinks: Mapping[str, ShmSink] | None = None,
) -> tuple[list[dict[str, Any]], bool, bool]:
    """The tensors' JSON entries; whether any went binary; whether their JSON
    data is all finite (orjson would write NaN and infinities as null)."""
    entries: list[dict[str, Any]] = []
    any_binary = False
    finite = True
    for name, array in arrays.items():
        what = f"{role} {name!r}"
        array = np.asarray(array)
        try:
            datatype = datatype_of(array)
        except InvalidInput as exc:
            raise fail(what, exc.message) from None
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        sink = sinks.get(name) if sinks else None
        if sink is not None:
            entry["parameters"] = _write_to_shm(what, to_binary(what, array, datatype), sink)
        elif binary(name) or datatype in BINARY_ONLY_DATATYPES:
            chunk = to_binary(what, array, datatype)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            any_binary = True
            if len(chunk):
                chunks.append(chunk)
        else:
            data = entry["data"] = json_value(what, array, datatype)
            if finite and isinstance(data, np.ndarray) and data.dtype.kind == "f":
                finite = bool(np.isfinite(data).all())
        entries.append(entry)
    return entries, any_binary, finite


def _write_to_shm(what: str, chunk: bytes | memoryview, sink: ShmSink) -> dict[str, Any]:
    data = memoryview(chunk).cast("B")   # a view of floats counts its items, not its bytes
    size = len(data)
    if size > sink.capacity:
        raise RegionTooSmall(
            f"{what}: shared memory region {sink.region!r} gives it {sink.capacity} bytes, "
            f"but it needs {size} bytes",
            subject=what,
        )
    sink.write(data)
    if sink.offset is None:
        return {REGION: sink.region, BYTE_SIZE: size}
    return {REGION: sink.region, BYTE_SIZE: size, OFFSET: sink.offset}


def _finite(value: Any) -> bool:
    """No NaN or infinity in ``value`` (parameters: a few small values)."""
    if type(value) is float:
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return True


def _finish(
    doc: dict[str, Any], chunks: list[bytes | memoryview], any_binary: bool, finite: bool
) -> tuple[list[bytes | memoryview], int | None]:
    header = json_codec.dumps(doc, exact=finite and _finite(doc.get("parameters")))
    return [header, *chunks], (len(header) if any_binary else None)


def encode_infer_request(
    inputs: Mapping[str, np.ndarray],
    *,
    binary: bool = True,
    outputs: Sequence[str] | None = None,
    binary_outputs: bool = True,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[list[bytes | memoryview], int | None]:
    """An infer request as body parts (JSON header first, then binary
    chunks) and the Inference-Header-Content-Length, None when the body is
    all JSON. FP16/BF16 go binary even when ``binary`` is False."""
    chunks: list[bytes | memoryview] = []
    entries, any_binary, finite = _encode_tensors(inputs, "input", lambda _: binary, chunks)
    doc: dict[str, Any] = {}
    if request_id is not None:
        doc["id"] = request_id
    request_parameters = dict(parameters or {})
    if outputs is None:
        request_parameters["binary_data_output"] = binary_outputs
    if request_parameters:
        doc["parameters"] = request_parameters
    doc["inputs"] = entries
    if outputs is not None:
        doc["outputs"] = [{"name": name, "parameters": {"binary_data": binary_outputs}} for name in outputs]
    return _finish(doc, chunks, any_binary, finite)


def encode_infer_response(
    *,
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray],
    binary: Callable[[str], bool],
    parameters: Mapping[str, Any] | None = None,
    sinks: Mapping[str, ShmSink] | None = None,
) -> tuple[list[bytes | memoryview], int | None]:
    """An infer response as body parts and header length (None: all JSON).
    ``binary(name)`` says which outputs go binary (InferRequest.wants_binary);
    FP16/BF16 outputs always do. Outputs in ``sinks`` are written into
    their shared memory instead (RegionTooSmall when one does not fit)."""
    chunks: list[bytes | memoryview] = []
    entries, any_binary, finite = _encode_tensors(outputs, "output", binary, chunks, sinks)
    doc: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        doc["model_version"] = model_version
    if request_id is not None:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = dict(parameters)
    doc["outputs"] = entries
    return _finish(doc, chunks, any_binary, finite)


def encode_answer_tensors(
    doc: Mapping[str, Any], outputs: Sequence[WireTensor], binary: Callable[[str], bool]
) -> tuple[list[bytes | memoryview], int | None]:
    """An infer response made of outputs that hold binary tensor data, as
    body parts and header length (None: all JSON): each output binary or
    JSON as ``binary(name)`` says (FP16/BF16 always binary), its other
    parameters kept; ``doc``'s fields (model_name, id, ...) as they are."""
    chunks: list[bytes | memoryview] = []
    entries: list[dict[str, Any]] = []
    any_binary, finite = False, True
    for tensor in outputs:
        data = tensor.data if tensor.data is not None else b""
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        parameters = {k: v for k, v in tensor.parameters.items() if k != "binary_data_size"}
        if binary(tensor.name) or tensor.datatype in BINARY_ONLY_DATATYPES:
            parameters["binary_data_size"] = len(data)
            any_binary = True
            if len(data):
                chunks.append(data)
        else:
            value = entry["data"] = json_value(tensor.what, tensor_to_numpy(tensor), tensor.datatype)
            if finite and isinstance(value, np.ndarray) and value.dtype.kind == "f":
                finite = bool(np.isfinite(value).all())
        if parameters:
            entry["parameters"] = parameters
        entries.append(entry)
    return _finish({**doc, "outputs": entries}, chunks, any_binary, finite)
