"""A validated infer request with its JSON tensor data as binary tensor data.

Why the daemon forwards JSON inputs this way: it has parsed and checked
every number already, and a runner that got the JSON would parse and check
them all again (for 1M FP32 values: ~70 ms to parse, ~35 ms to check, and
the numpy conversion) where binary bytes become an array with no work at
all. Every runner speaks the binary tensor data extension (the runner
contract), so the request means the same to it; what the client asked of
the outputs (JSON or binary, which ones) is left as it was. (A request
that names shared memory, or a mixed one forwarded through the tensor
arena, keeps its JSON data as the client wrote it: rare, and small.)
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from . import json_codec
from .datatypes import numpy_dtype
from .elements import fail
from .framing import HEADER_LENGTH, InferRequest, WireTensor
from .shared_memory import REGION
from .tensors import frame_bytes

__all__ = ["binary_form", "body_headers", "encoded_doc", "runner_doc", "tensor_bytes", "with_inputs"]


def binary_form(req: InferRequest) -> tuple[list[bytes | memoryview], int] | None:
    """The body parts (JSON header first) and header length of ``req`` with
    each input's JSON "data" sent binary; None when no input has JSON data.
    ``req`` must have passed validate_request, which leaves JSON data flat
    and of its datatype."""
    if req.header is None or all(t.json_data is None for t in req.inputs):
        return None
    doc = dict(req.header)
    entries: list[Any] = []
    chunks: list[bytes | memoryview] = []
    for entry, tensor in zip(doc["inputs"], req.inputs, strict=True):
        if tensor.json_data is not None:
            chunk = _binary_data(tensor)
            entry = {key: value for key, value in entry.items() if key != "data"}
            entry["parameters"] = {**tensor.parameters, "binary_data_size": len(chunk)}
        else:
            chunk = tensor_bytes(tensor)   # binary as sent; shared memory: no bytes
        entries.append(entry)
        if len(chunk):
            chunks.append(chunk)
    doc["inputs"] = entries
    # exact=False: the header is small once the data is out, and what the
    # strict parser let in (NaN in parameters) is written as it came.
    header = json_codec.dumps(doc, exact=False)
    return [header, *chunks], len(header)


def tensor_bytes(tensor: WireTensor) -> bytes | memoryview:
    """A validated input's binary tensor data: as sent, or its JSON data
    packed (flat, of its datatype, as validate_request leaves it); no bytes
    for one in shared memory."""
    if tensor.json_data is not None:
        return _binary_data(tensor)
    return tensor.data if tensor.data is not None else b""


def _binary_data(tensor: WireTensor) -> bytes | memoryview:
    flat: list[Any] = tensor.json_data  # type: ignore[assignment]  # the caller's check: not None
    if tensor.datatype == "BYTES":
        try:
            return frame_bytes(tensor.what, flat)
        except UnicodeEncodeError:   # a lone surrogate (\ud800) the JSON spelled out
            index = next(i for i, element in enumerate(flat) if not _encodes(element))
            raise fail(tensor.what, f"BYTES element {index} is not valid Unicode (a lone surrogate)") from None
    array = np.fromiter(flat, dtype=numpy_dtype(tensor.datatype), count=len(flat))   # np.array: 20% slower
    return array.view(np.uint8).data


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def runner_doc(req: InferRequest, region_names: dict[str, str] | None = None) -> dict[str, Any]:
    """The JSON header of a request parsed from another framing than JSON
    (gRPC's), in the binary form a runner takes: its inputs' data follow
    in order, each input's binary_data_size among its parameters. Regions
    are named by ``region_names`` (the caller's name -> the runner's)."""
    inputs = []
    for tensor in req.inputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if tensor.parameters:
            entry["parameters"] = _renamed(tensor.parameters, region_names)
        inputs.append(entry)
    doc: dict[str, Any] = {"inputs": inputs, "parameters": dict(req.parameters)}
    if req.id:
        doc["id"] = req.id
    if req.outputs is not None:
        doc["outputs"] = [{"name": out.name, "parameters": _renamed(out.parameters, region_names)}
                          for out in req.outputs]
    return doc


def _renamed(parameters: dict[str, Any], region_names: dict[str, str] | None) -> dict[str, Any]:
    region = parameters.get(REGION)
    if region_names is None or region not in region_names:
        return dict(parameters)
    return {**parameters, REGION: region_names[region]}


def encoded_doc(doc: dict[str, Any]) -> bytes:
    """A header as a runner reads it; what the strict parser lets in (NaN
    in parameters) written as it came."""
    return json_codec.dumps(doc, exact=False)


def with_inputs(parts: list[bytes | memoryview], header_length: int | None,
                extra: list[dict[str, Any]]) -> tuple[list[bytes | memoryview], int]:
    """A checked request as a runner takes it (``parts``: its body, JSON
    header first when ``header_length`` is set, else all JSON) with
    ``extra`` inputs, JSON data each, added to its header; the binary data
    after the header stay as they were."""
    rest: list[bytes | memoryview] = []
    if header_length is None:
        head = b"".join(parts)
    else:
        head, rest = _split(parts, header_length)
    doc = json.loads(head)
    doc["inputs"] = [*doc.get("inputs", ()), *extra]
    header = encoded_doc(doc)
    return [header, *rest], len(header)


def _split(parts: list[bytes | memoryview], length: int) -> tuple[bytes, list[bytes | memoryview]]:
    """The first ``length`` bytes of ``parts`` and views of the rest."""
    head: list[bytes | memoryview] = []
    rest: list[bytes | memoryview] = []
    left = length
    for part in parts:
        view = memoryview(part)
        if left >= len(view):
            head.append(view)
            left -= len(view)
        else:
            if left:
                head.append(view[:left])
            rest.append(view[left:])
            left = 0
    return b"".join(head), rest


def body_headers(header_length: int | None) -> dict[str, str]:
    """The headers of a v2 body (a request or an answer): binary with its
    JSON header's length, or JSON alone."""
    if header_length is None:
        return {"Content-Type": "application/json"}
    return {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(header_length)}
