"""The v2 gRPC messages (Triton's, as tritonclient[grpc] ships them) to and
from the parsed v2 forms the inference core works on: a ModelInferRequest
becomes the InferRequest an HTTP body would have parsed to (the same
structural checks, the same messages), and a runner's answer, parsed once
by the core, becomes a ModelInferResponse.

Pure: no daemon state. Each ``raw_input_contents`` entry becomes a
tensor's data as a memoryview (not copied again on the way to the runner);
typed ``contents`` are packed once into their binary form.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from cartonstore.errors import InvalidInput

from .datatypes import ELEMENT_SIZES, check_datatype, numpy_dtype
from .elements import fail
from .shared_memory import REGION, shm_ref
from .tensors import frame_bytes
from .wire_types import InferRequest, RequestedOutput, WireTensor

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


def request_of(req: pb.ModelInferRequest) -> InferRequest:
    """``req`` as the InferRequest its HTTP binary form would parse to:
    every output asked for in binary (unless in shared memory), each
    input's data a memoryview of its raw_input_contents entry or of its
    typed contents packed. Structure only, as framing.parse_infer_request checks
    it; validation against the model is the caller's."""
    raws = req.raw_input_contents
    if raws and any(t.HasField("contents") for t in req.inputs):
        raise _refuse("an infer request gives tensors either in raw_input_contents or in contents, not both")
    inputs: list[WireTensor] = []
    given = 0
    for index, tensor in enumerate(req.inputs):
        what = f"input {tensor.name!r}"
        params = _parameters(tensor.parameters, what)
        data: memoryview | None = None
        if REGION not in params:
            if raws:
                if given >= len(raws):
                    raise _refuse(f"raw_input_contents has {len(raws)} entries, fewer than the inputs not in "
                                  f"shared memory (no entry for {what})", tensor.name)
                data = memoryview(raws[given])
            else:
                data = memoryview(typed_bytes(tensor))
            given += 1
            params["binary_data_size"] = len(data)
        inputs.append(_input(index, tensor, params, data))
    if raws and len(raws) != given:
        raise _refuse(f"raw_input_contents has {len(raws)} entries for {given} input(s) not in shared memory")
    parameters = {**_parameters(req.parameters, "the request"), "binary_data_output": True}
    return InferRequest(req.id or None, inputs, _requested(req.outputs), parameters, True)


def _input(index: int, tensor: pb.ModelInferRequest.InferInputTensor, params: dict[str, Any],
           data: memoryview | None) -> WireTensor:
    if not tensor.name:
        raise fail(f"input #{index}", "\"name\" must be a non-empty string, not ''")
    what = f"input {tensor.name!r}"
    if tensor.datatype not in ELEMENT_SIZES:
        check_datatype(tensor.datatype, what)
    shape = list(tensor.shape)
    if any(dim < 0 for dim in shape):
        raise fail(what, f'"shape" must be an array of integers >= 0, not {shape!r}')
    shm = shm_ref(params, what)
    return WireTensor(tensor.name, tensor.datatype, shape, params, data, None, "input", shm)


def _requested(outputs: Sequence[pb.ModelInferRequest.InferRequestedOutputTensor]) -> list[RequestedOutput] | None:
    if not outputs:   # Triton returns every output when none is named
        return None
    requested: list[RequestedOutput] = []
    seen: set[str] = set()
    for index, out in enumerate(outputs):
        what = f"requested output {out.name!r}"
        params = _parameters(out.parameters, what)
        if not out.name:
            raise fail(f"requested output #{index}", "\"name\" must be a non-empty string, not ''")
        if out.name in seen:
            raise fail(what, "is requested twice")
        seen.add(out.name)
        shm = shm_ref(params, what)
        if shm is None:
            params["binary_data"] = True
        requested.append(RequestedOutput(out.name, True if shm is None else None, params, shm))
    return requested


def _json_bytes(data: Any, datatype: str, what: str) -> bytes:
    if datatype == "BYTES":
        return frame_bytes(what, np.asarray(data, dtype=object).reshape(-1).tolist())
    try:
        return np.asarray(data, dtype=numpy_dtype(datatype)).tobytes()
    except (TypeError, ValueError) as e:
        raise _refuse(f"{what}: its JSON data is not {datatype}: {e}") from None


def response_of(doc: dict[str, Any], outputs: Sequence[WireTensor]) -> pb.ModelInferResponse:
    """A runner's 200 answer, parsed (``doc``, its JSON header; ``outputs``,
    its tensors with their parameters as the client is to see them and
    their bytes in ``data``, none for one written into shared memory), as
    a ModelInferResponse: one raw_output_contents entry per output, in
    order, as tritonclient reads them."""
    resp = pb.ModelInferResponse(model_name=str(doc.get("model_name", "")),
                                 model_version=str(doc.get("model_version", "")), id=str(doc.get("id") or ""))
    for key, value in (doc.get("parameters") or {}).items():
        set_parameter(resp.parameters[key], value)
    raw = []
    for out in outputs:
        tensor = resp.outputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
        for key, value in out.parameters.items():
            if key != "binary_data_size":
                set_parameter(tensor.parameters[key], value)
        if out.data is not None:
            raw.append(bytes(out.data))
        elif out.json_data is not None:
            raw.append(_json_bytes(out.json_data, out.datatype, out.what))
        else:
            raw.append(b"")   # written into shared memory
    resp.raw_output_contents.extend(raw)
    return resp
