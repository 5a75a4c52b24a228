"""Validation of parsed infer requests against a carton's declared tensors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import TensorSpec
from cartonstore.v2.framing import encode_infer_request, parse_infer_request
from cartonstore.v2.validate import validate_request
from cartonstore.v2.wire_types import InferRequest

SPECS = [
    TensorSpec("x", "float32", ("batch", 4)),
    TensorSpec("mask", "uint8", ("batch", "*")),
    TensorSpec("text", "string", ("batch",)),
]
OUTPUTS = [TensorSpec("y", "float32", ("batch", 2))]


def request(arrays: dict, *, binary: bool = True, outputs=None) -> InferRequest:
    parts, header_length = encode_infer_request(arrays, binary=binary, outputs=outputs)
    return parse_infer_request(b"".join(bytes(p) for p in parts), header_length)


def good(batch: int = 2, **replace) -> dict[str, np.ndarray]:
    arrays = {
        "x": np.zeros((batch, 4), np.float32),
        "mask": np.zeros((batch, 7), np.uint8),
        "text": np.array([b"a"] * batch, dtype=object),
    }
    arrays.update(replace)
    return {k: v for k, v in arrays.items() if v is not None}


def raw_request(inputs: list, binary: bytes = b"", outputs=None) -> InferRequest:
    doc = {"inputs": inputs}
    if outputs is not None:
        doc["outputs"] = [{"name": n} for n in outputs]
    header = json.dumps(doc).encode()
    return parse_infer_request(header + binary, len(header) if binary else None)


@pytest.mark.parametrize("binary", [True, False])
def test_valid_requests_pass(binary) -> None:
    validate_request(request(good(), binary=binary), SPECS, OUTPUTS)
    validate_request(request(good(batch=5), binary=binary, outputs=["y"]), SPECS, OUTPUTS)


CASES = [
    (good(extra=np.zeros(1, np.float32)), SPECS, "input 'extra': is not an input of this model (inputs: 'x', 'mask', 'text')"),
    (good(mask=None), SPECS, "input 'mask' is missing (the model needs 'x', 'mask', 'text')"),
    (good(x=np.zeros((2, 4), np.float64)), SPECS, "input 'x': datatype is FP64 but the model expects FP32"),
    (good(text=np.zeros(2, np.int32)), SPECS, "input 'text': datatype is INT32 but the model expects BYTES"),
    (good(x=np.zeros((2, 4, 1), np.float32)), SPECS,
     "input 'x': shape [2, 4, 1] has rank 3 but the model expects rank 2 ([batch, 4])"),
    (good(x=np.zeros((2, 5), np.float32)), SPECS,
     "input 'x': shape [2, 5] has 5 in dimension 1 but the model expects 4 ([batch, 4])"),
    (good(mask=np.zeros((3, 7), np.uint8)), SPECS,
     "input 'mask': symbol 'batch' is 3 in dimension 0 of shape [3, 7] but 2 in input 'x'"),
    (good(text=np.array([b"a"], object)), SPECS, "input 'text': symbol 'batch' is 1"),
    ({"a": np.zeros((2, 3), np.int64), "b": np.zeros((2, 4), np.int64)},
     [TensorSpec("a", "int64", "s"), TensorSpec("b", "int64", "s")],
     "input 'b': symbol 's' is [2, 4] in shape [2, 4] but [2, 3] in input 'a'"),
    ({"a": np.zeros((3, 2), np.int32)}, [TensorSpec("a", "int32", ("n", "n"))],
     "input 'a': symbol 'n' is 2 in dimension 1 of shape [3, 2] but 3 in input 'a'"),
    ({"a": np.zeros((2, 3), np.int64), "b": np.zeros((2, 3), np.int64)},
     [TensorSpec("a", "int64", "s"), TensorSpec("b", "int64", "s")], None),
    ({"a": np.zeros((2, 3, 9), np.int8)}, [TensorSpec("a", "int8", None)], None),
    ({"a": np.zeros((), np.int8)}, [TensorSpec("a", "int8", "*")], None),
    ({"a": np.zeros((), np.int8)}, [TensorSpec("a", "int8", ())], None),
    ({"a": np.zeros((1,), np.int8)}, [TensorSpec("a", "int8", ())], "rank 1 but the model expects rank 0"),
    ({}, [TensorSpec("a", "int8", None)], "input 'a' is missing"),
]


@pytest.mark.parametrize(("arrays", "specs", "message"), CASES)
def test_request_against_specs(arrays, specs, message) -> None:
    req = request(arrays)
    if message is None:
        validate_request(req, specs, None)
        return
    with pytest.raises(InvalidInput) as info:
        validate_request(req, specs, None)
    assert message in str(info.value)


def test_unknown_requested_output() -> None:
    with pytest.raises(InvalidInput, match="requested output 'z' is not an output of this model \\(outputs: 'y'\\)"):
        validate_request(request(good(), outputs=["y", "z"]), SPECS, OUTPUTS)
    validate_request(request(good(), outputs=["y", "z"]), SPECS, None)  # outputs undeclared: anything goes


DATA_CASES = [
    ([{"name": "x", "datatype": "FP32", "shape": [4, 4], "parameters": {"binary_data_size": 60}}], b"\0" * 60,
     "input 'x': binary_data_size 60 does not match shape [4, 4] of FP32 (64 bytes)"),
    ([{"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 11}}],
     b"\1\0\0\0a\1\0\0\0b\0", "input 's': BYTES element 2 at byte 10 has a truncated length prefix"),
    ([{"name": "s", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": 10}}],
     b"\1\0\0\0a\1\0\0\0b", "input 's': shape [3] needs 3 elements but there are 2 BYTES elements"),
    ([{"name": "s", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 5}}],
     b"\5\0\0\0a", "input 's': BYTES element 0 claims 5 bytes but only 1 remain"),
    ([{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2, 3]}], b"",
     "input 'x': shape [2] needs 2 elements but there are 3 values in its JSON data"),
    ([{"name": "x", "datatype": "FP16", "shape": [1], "data": [1.0]}], b"", "input 'x': FP16 data cannot be sent as JSON"),
    ([{"name": "x", "datatype": "INT32", "shape": [2], "data": [1, None]}], b"",
     "input 'x': INT32 JSON data must be integers, but element 1 is null"),
    ([{"name": "x", "datatype": "INT32", "shape": [1], "data": [2**31]}], b"", "JSON value 2147483648 is out of range"),
    ([{"name": "x", "datatype": "BOOL", "shape": [2], "data": [True, 0]}], b"", "element 1 is the number 0"),
    ([{"name": "x", "datatype": "FP64", "shape": [2], "data": [1.5, 10**400]}], b"",
     "input 'x': a JSON value is out of range for FP64"),
    ([{"name": "x", "datatype": "INT8", "shape": [1], "data": [1]},
      {"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}], b"", "input 'x': is given twice"),
    ([{"name": "s", "datatype": "BYTES", "shape": [2, 1], "data": [["a"], ["b"]]}], b"", None),
    ([{"name": "s", "datatype": "BYTES", "shape": [0], "parameters": {"binary_data_size": 0}}], b"", None),
]


@pytest.mark.parametrize(("inputs", "binary", "message"), DATA_CASES)
def test_tensor_data_checks_without_specs(inputs, binary, message) -> None:
    if binary == b"" and any("parameters" in i for i in inputs):
        header = json.dumps({"inputs": inputs}).encode()
        req = parse_infer_request(header, len(header))
    else:
        req = raw_request(inputs, binary)
    if message is None:
        validate_request(req, None, None)
        return
    with pytest.raises(InvalidInput) as info:
        validate_request(req, None, None)
    assert message in str(info.value)
