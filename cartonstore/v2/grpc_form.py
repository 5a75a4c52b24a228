"""The v2 gRPC messages (Triton's, as tritonclient[grpc] ships them) to and
from the binary tensor form the HTTP path speaks: a gRPC infer request
becomes the JSON header and binary parts an HTTP client would have sent,
and a runner's answer in that form becomes a ModelInferResponse. So gRPC
is a second framing of the one inference path, not a second one.

Pure: no daemon state. ``raw_input_contents`` become binary parts as they
are (no copy); typed ``contents`` are packed once into their binary form.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from cartonstore.errors import InvalidInput

from .datatypes import numpy_dtype
from .shm_params import REGION
from .tensors import frame_bytes

# datatype -> the typed contents field that carries it (FP16 and BF16 have none: raw only)
CONTENTS_FIELDS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
_ALL_FIELDS = sorted(set(CONTENTS_FIELDS.values()))
# the HTTP binary form's own parameters: over gRPC the daemon sets them, a client may not
HTTP_ONLY = ("binary_data_size", "binary_data", "binary_data_output")


def _refuse(message: str, subject: str | None = None) -> InvalidInput:
    return InvalidInput(message, subject=subject)


def parameter_value(param: pb.InferParameter) -> Any:
    kind = param.WhichOneof("parameter_choice")
    return None if kind is None else getattr(param, kind)


def set_parameter(param: pb.InferParameter, value: Any) -> None:
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        if value >= 1 << 63:
            param.uint64_param = value
        else:
            param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = value if isinstance(value, str) else json.dumps(value)


def _parameters(params: Any, what: str) -> dict[str, Any]:
    out = {key: parameter_value(value) for key, value in params.items()}
    for key in HTTP_ONLY:
        if key in out:
            raise _refuse(f"{what}: parameter {key!r} belongs to the HTTP binary tensor form; over gRPC send "
                          f"tensors in raw_input_contents or contents", key)
    return out


def typed_bytes(tensor: pb.ModelInferRequest.InferInputTensor) -> bytes:
    """An input's typed ``contents`` packed in its binary form."""
    what = f"input {tensor.name!r}"
    given = [f for f in _ALL_FIELDS if len(getattr(tensor.contents, f))]
    wanted = CONTENTS_FIELDS.get(tensor.datatype)
    if wanted is None:
        if tensor.datatype in ("FP16", "BF16"):
            raise _refuse(f"{what}: {tensor.datatype} has no typed contents field; send it in raw_input_contents",
                          tensor.name)
        raise _refuse(f"{what}: unknown datatype {tensor.datatype!r}", tensor.name)
    stray = [f for f in given if f != wanted]
    if stray:
        raise _refuse(f"{what} is {tensor.datatype}, whose contents go in {wanted}, not {', '.join(stray)}",
                      tensor.name)
    values = getattr(tensor.contents, wanted)
    if tensor.datatype == "BYTES":
        return frame_bytes(what, list(values))
    dtype = numpy_dtype(tensor.datatype)
    if dtype.kind in "iu" and dtype.itemsize < 4 and len(values):
        wide = np.asarray(values, dtype=np.int64)
        info = np.iinfo(dtype)
        if wide.min() < info.min or wide.max() > info.max:
            raise _refuse(f"{what}: a value in {wanted} is outside {tensor.datatype}'s range "
                          f"[{info.min}, {info.max}]", tensor.name)
        return wide.astype(dtype).tobytes()
    return np.asarray(values, dtype=dtype).tobytes()


def framed_request(req: pb.ModelInferRequest) -> tuple[list[Any], int]:
    """(parts, header length): ``req`` as an HTTP client would have sent
    it in the binary tensor form, every output asked for in binary."""
    raws = req.raw_input_contents
    if raws and any(t.HasField("contents") for t in req.inputs):
        raise _refuse("an infer request gives tensors either in raw_input_contents or in contents, not both")
    inputs: list[dict[str, Any]] = []
    data: list[Any] = []
    for tensor in req.inputs:
        what = f"input {tensor.name!r}"
        params = _parameters(tensor.parameters, what)
        entry = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        if REGION not in params:
            if raws:
                if len(data) >= len(raws):
                    raise _refuse(f"raw_input_contents has {len(raws)} entries, fewer than the inputs not in "
                                  f"shared memory (no entry for {what})", tensor.name)
                part = raws[len(data)]
            else:
                part = typed_bytes(tensor)
            data.append(part)
            params["binary_data_size"] = len(part)
        if params:
            entry["parameters"] = params
        inputs.append(entry)
    if raws and len(raws) != len(data):
        raise _refuse(f"raw_input_contents has {len(raws)} entries for {len(data)} input(s) not in shared memory")
    header: dict[str, Any] = {"inputs": inputs, "parameters": {**_parameters(req.parameters, "the request"),
                                                               "binary_data_output": True}}
    if req.id:
        header["id"] = req.id
    if req.outputs:
        outputs = []
        for out in req.outputs:
            params = _parameters(out.parameters, f"requested output {out.name!r}")
            if REGION not in params:
                params["binary_data"] = True
            outputs.append({"name": out.name, "parameters": params})
        header["outputs"] = outputs
    head = json.dumps(header, separators=(",", ":")).encode()
    return [head, *data], len(head)


class _Reader:
    """The bytes after a response's JSON header, across the parts they
    came in (the answer's body, then views of a tensor arena slot)."""

    def __init__(self, parts: list[memoryview]) -> None:
        self.parts = [p for p in parts if len(p)]
        self.at = 0

    def take(self, size: int, what: str) -> bytes:
        out = []
        while size:
            if not self.parts:
                raise _refuse(f"the runner's answer ends before {what}'s bytes")
            part = self.parts[0]
            piece = part[self.at:self.at + size]
            out.append(piece)
            size -= len(piece)
            self.at += len(piece)
            if self.at == len(part):
                self.parts.pop(0)
                self.at = 0
        return bytes(out[0]) if len(out) == 1 else b"".join(out)


def _json_bytes(data: Any, datatype: str, what: str) -> bytes:
    if datatype == "BYTES":
        return frame_bytes(what, np.asarray(data, dtype=object).reshape(-1).tolist())
    try:
        return np.asarray(data, dtype=numpy_dtype(datatype)).tobytes()
    except (TypeError, ValueError) as e:
        raise _refuse(f"{what}: its JSON data is not {datatype}: {e}") from None


def grpc_response(parts: list[Any], header_length: int | None) -> pb.ModelInferResponse:
    """The runner's 200 answer (its body, then any arena views) as a
    ModelInferResponse: one raw_output_contents entry per output, in order
    (empty for one written into shared memory), as tritonclient reads them."""
    first = memoryview(parts[0])
    end = len(first) if header_length is None else header_length
    doc = json.loads(bytes(first[:end]))
    reader = _Reader([first[end:], *(memoryview(p) for p in parts[1:])])
    resp = pb.ModelInferResponse(model_name=str(doc.get("model_name", "")),
                                 model_version=str(doc.get("model_version", "")), id=str(doc.get("id") or ""))
    for key, value in (doc.get("parameters") or {}).items():
        set_parameter(resp.parameters[key], value)
    raw = []
    for out in doc.get("outputs") or ():
        tensor = resp.outputs.add(name=out["name"], datatype=out["datatype"], shape=out["shape"])
        params = dict(out.get("parameters") or {})
        size = params.pop("binary_data_size", None)
        for key, value in params.items():
            set_parameter(tensor.parameters[key], value)
        what = f"output {out['name']!r}"
        if size is not None:
            raw.append(reader.take(size, what))
        elif "data" in out:
            raw.append(_json_bytes(out["data"], out["datatype"], what))
        else:
            raw.append(b"")   # written into shared memory
    resp.raw_output_contents.extend(raw)
    return resp
