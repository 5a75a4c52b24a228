"""The v2 JSON codec (orjson, with the stdlib where they differ) and the
binary form the daemon forwards JSON inputs in."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from cartonstore.errors import InvalidInput
from cartonstore.server.calls.bodies import json_object
from cartonstore.v2 import json_codec
from cartonstore.v2.binary_form import binary_form
from cartonstore.v2.framing import encode_infer_response, parse_infer_request, parse_infer_response, tensor_to_numpy
from cartonstore.v2.validate import validate_request

# -- loads: a repeated key is refused wherever it hides -------------------------------------

REPEATED = [
    b'{"inputs": [], "inputs": []}',
    b'{"inputs": [{"name": "a", "name": "b", "datatype": "FP32", "shape": [1], "data": [1]}]}',
    b'{"inputs": [], "parameters": {"p": 1, "p": 2}}',
    b'{"inputs": [], "x": [[{"deep": 1, "deep": 2}]]}',
    b'{"inputs": [], "x": [1.5, 2.5, {"k": 1, "k": 1}]}',
    # the dropped value's own colons must not make up for the dropped key
    b'{"a": "x", "a": "y:z"}',
    # an escaped colon parses to a colon the text does not hold: it must not hide a repeat
    b'{"a": 1, "a": 2, "s": "\\u003a"}',
    b'{"a": 1, "a": 2, "s": "\\u003A"}',
    # the same key spelled with an escape
    b'{"a": 1, "\\u0061": 2}',
]


# Texts under json_codec.SMALL are read by the stdlib alone; padded with
# whitespace (still the same JSON), the same texts take orjson's way.
WAYS = {"stdlib": 0, "orjson": json_codec.SMALL}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("text", REPEATED)
def test_a_repeated_key_is_refused(text: bytes, way: str) -> None:
    with pytest.raises(ValueError, match="appears twice in one object"):
        json_codec.loads(text + b" " * WAYS[way])


ACCEPTED = [
    b'{"a": "x:y", "b:c": [":", "::"], "d": {"e": "f:"}}',
    b'{"s": "\\u003a", "t": ":"}',
    b'{"data": [1, 2.5, -3, 1e10, true, false, null]}',
    b'{"data": ["a", ["b:", {"c": 1}], []]}',
    b'  {"x" :  1 , "y"\n:\t2}  ',
    b'{"big": 123456789012345678901234567890}',
    b'{"low": -9223372036854775809, "high": 18446744073709551616, "max": 18446744073709551615}',
    b'{"f": 0.30000000000000004, "g": 1234567890123456.8, "e": 1.2345678901234567e+300}',
]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("text", ACCEPTED)
def test_what_the_stdlib_reads_is_read_alike(text: bytes, way: str) -> None:
    assert json_codec.loads(text + b" " * WAYS[way]) == json.loads(text)


@pytest.mark.parametrize("text", [b'{"x": NaN}', b'{"x": [Infinity, -Infinity]}', b'{"x": 1e400}',
                                  b'{"x": "\\ud800"}'])
def test_what_only_the_stdlib_takes_is_taken_as_before(text: bytes) -> None:
    got, want = json_codec.loads(text + b" " * json_codec.SMALL), json.loads(text)
    assert repr(got) == repr(want)   # NaN != NaN: compare how they read


def test_a_big_integer_keeps_every_digit() -> None:
    # orjson would read it as a float; the type check must see the integer the client wrote
    doc = json_codec.loads(b'{"x": [1, 123456789012345678901234567890]}' + b" " * json_codec.SMALL)
    assert doc["x"][1] == 123456789012345678901234567890 and type(doc["x"][1]) is int


@pytest.mark.parametrize("text", [b"", b"{", b'{"a": 1,}', b"\xff\xfe", b'{"a": 01}', b"[1] x"])
def test_text_that_is_not_json_is_a_value_error(text: bytes) -> None:
    with pytest.raises(ValueError):
        json_codec.loads(text)


def test_a_repeated_key_in_a_request_is_a_400_naming_it() -> None:
    body = b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}], "inputs": []}'
    with pytest.raises(InvalidInput, match="JSON is not valid: key 'inputs' appears twice"):
        parse_infer_request(body, None)


# -- dumps -------------------------------------------------------------------------------


def test_numbers_are_written_as_they_read_back() -> None:
    for dtype in (np.float32, np.float64, np.int8, np.uint16, np.int64, np.uint64, np.bool_):
        a = (np.arange(-50, 50) * 0.37).astype(dtype) if dtype not in (np.uint16, np.uint64) else \
            np.arange(100, dtype=dtype) * 997
        back = np.array(json.loads(json_codec.dumps({"d": a}))["d"], dtype=dtype)
        assert np.array_equal(back, a), dtype


def test_non_finite_floats_and_huge_ints_are_written_by_the_stdlib() -> None:
    a = np.array([1.0, math.nan, math.inf], dtype=np.float32)
    assert json_codec.dumps({"d": a}, exact=False) == b'{"d":[1.0,NaN,Infinity]}'
    assert json_codec.dumps({"n": 2**70}) == b'{"n":1180591620717411303424}'


def test_a_response_with_nan_keeps_nan() -> None:
    parts, length = encode_infer_response(model_name="m", model_version="1", request_id=None,
                                          outputs={"y": np.array([1.5, np.nan], dtype=np.float32)},
                                          binary=lambda _: False)
    assert length is None and b"NaN" in parts[0]
    _, arrays = parse_infer_response(b"".join(parts), None)
    assert arrays["y"][0] == 1.5 and np.isnan(arrays["y"][1])


# -- the binary form -----------------------------------------------------------------------


def _request(doc: dict, binary: bytes = b"") -> object:
    header = json.dumps(doc).encode()
    body = header + binary
    req = parse_infer_request(body, len(header) if binary else None)
    validate_request(req, None, None)
    return req


def _reparsed(parts: list, length: int) -> tuple[dict, dict]:
    body = b"".join(bytes(p) for p in parts)
    req = parse_infer_request(body, length)
    return json.loads(body[:length]), {t.name: tensor_to_numpy(t) for t in req.inputs}


@pytest.mark.parametrize("datatype,data,dtype", [
    ("FP32", [[1.5, -2.25], [3, 4]], np.float32), ("FP64", [1e300, -0.1], np.float64),
    ("INT8", [-128, 127], np.int8), ("UINT64", [0, 2**64 - 1], np.uint64), ("BOOL", [True, False], np.bool_),
])
def test_json_inputs_become_binary_data_of_the_same_values(datatype: str, data: list, dtype: type) -> None:
    count = len(np.array(data).reshape(-1))
    req = _request({"id": "r1", "inputs": [{"name": "x", "datatype": datatype, "shape": [count], "data": data,
                                            "parameters": {"mine": "kept"}}],
                    "outputs": [{"name": "y", "parameters": {"binary_data": False}}], "parameters": {"p": 1}})
    parts, length = binary_form(req)
    header, arrays = _reparsed(parts, length)
    assert header["inputs"][0]["parameters"] == {"mine": "kept", "binary_data_size": count * np.dtype(dtype).itemsize}
    assert "data" not in header["inputs"][0]
    assert header["id"] == "r1" and header["parameters"] == {"p": 1}
    assert header["outputs"] == [{"name": "y", "parameters": {"binary_data": False}}]
    assert arrays["x"].dtype == dtype and np.array_equal(arrays["x"], np.array(data, dtype=dtype).reshape(-1))


def test_strings_become_framed_bytes() -> None:
    req = _request({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [3], "data": ["a", "", "héllo:"]}]})
    parts, length = binary_form(req)
    _, arrays = _reparsed(parts, length)
    assert arrays["s"].tolist() == [b"a", b"", "héllo:".encode()]


def test_binary_inputs_keep_their_place_among_converted_ones() -> None:
    b = np.arange(3, dtype=np.int32)
    req = _request({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [7]},
                               {"name": "b", "datatype": "INT32", "shape": [3], "parameters": {"binary_data_size": 12}},
                               {"name": "c", "datatype": "INT8", "shape": [2], "data": [1, 2]}]}, b.tobytes())
    parts, length = binary_form(req)
    _, arrays = _reparsed(parts, length)
    assert arrays["a"].tolist() == [7.0] and arrays["b"].tolist() == [0, 1, 2] and arrays["c"].tolist() == [1, 2]


def test_a_request_without_json_data_is_left_as_it_came() -> None:
    req = _request({"inputs": [{"name": "b", "datatype": "INT32", "shape": [1], "parameters": {"binary_data_size": 4}}]},
                   bytes(4))
    assert binary_form(req) is None


def test_a_lone_surrogate_in_a_string_is_a_400_naming_it() -> None:
    body = b'{"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2], "data": ["ok", "\\ud800"]}]}'
    req = parse_infer_request(body, None)
    validate_request(req, None, None)
    with pytest.raises(InvalidInput, match="input 's'.*BYTES element 1 is not valid Unicode"):
        binary_form(req)


def test_non_finite_parameters_are_written_as_before() -> None:
    parts, _ = encode_infer_response(model_name="m", model_version="1", request_id=None,
                                     outputs={"y": np.array([1.5], dtype=np.float32)}, binary=lambda _: False,
                                     parameters={"score": math.nan, "limits": [math.inf, 1.0]})
    assert b'"score":NaN' in parts[0] and b'"limits":[Infinity,1.0]' in parts[0]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("depth", [257, 600, 995])
def test_nesting_past_the_limit_is_a_value_error(depth: int, way: str) -> None:
    deep = b"[" * depth + b"1" + b"]" * depth
    for text in (b'{"x": ' + deep + b"}", b'{"s": "\\u003a", "x": ' + deep + b"}"):   # orjson's way, the stdlib's
        with pytest.raises((ValueError, RecursionError)):
            json_codec.loads(text + b" " * WAYS[way])


def test_nesting_a_request_may_need_is_read() -> None:
    data = 1.5
    for _ in range(64):
        data = [data]
    assert json_codec.loads(json.dumps({"x": data}).encode()) == {"x": data}


def test_deep_data_or_parameters_are_a_400() -> None:
    deep_data = "[" * 300 + "1" + "]" * 300
    for body in ('{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": ' + deep_data + '}]}',
                 '{"inputs": [], "parameters": {"p": ' + deep_data + '}}'):
        with pytest.raises(InvalidInput, match="JSON is not valid: arrays and objects nested"):
            parse_infer_request(body.encode(), None)


def test_arrays_of_numbers_alone_are_noted() -> None:
    pad = b" " * json_codec.SMALL
    doc, numbers = json_codec.loads_noting_numbers(
        b'{"a": [1, 2.5, -3e5], "b": [[1, 2], [3]], "c": [1, "2"], "d": [1, null], "e": []}' + pad)
    noted = {name for name, value in doc.items() if id(value) in numbers}
    assert noted == {"a", "e"} and {id(x) for x in doc["b"]} <= numbers
    for text in (b'{"a": [1, 2.5], "b": [true]}', b'{"a": [1, 2.5], "s": "false"}'):   # a boolean anywhere: none
        assert json_codec.loads_noting_numbers(text + pad)[1] == frozenset()
    for text in (b'{"a": [1, 2], "s": "\\u003a"}', b'{"a": [1, 2]}'):   # the stdlib's way: none noted
        assert json_codec.loads_noting_numbers(text + (pad if b"003a" in text else b""))[1] == frozenset()


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("data,problem", [
    ([1.5, True], "element 1 is a boolean"), ([1, "2"], "element 1 is a string"), ([[1.5], [2]], None),
    ([1.5, 2, 3], "needs 2 elements"), ([1.5, None], "element 1 is null"), ([1.5, 2], None),
])
def test_float_data_checked_the_short_way_or_the_long(data: list, problem: str | None, way: str) -> None:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": data}]}).encode()
    req = parse_infer_request(body + b" " * WAYS[way], None)
    # The short way (numbers noted by the parser) only for a flat list of numbers read by orjson.
    flat_numbers = all(type(v) in (int, float) for v in data)
    assert req.inputs[0].json_numbers == (way == "orjson" and flat_numbers)
    if problem is None:
        validate_request(req, None, None)
        assert tensor_to_numpy(req.inputs[0]).tolist() == [1.5, 2.0]
    else:
        with pytest.raises(InvalidInput, match=problem):
            validate_request(req, None, None)


def test_every_json_route_refuses_a_repeated_key() -> None:   # json_object: the lease and repository routes' bodies
    with pytest.raises(InvalidInput, match="request body is not valid JSON: key 'model' appears twice"):
        json_object(b'{"model": "a", "model": "b"}')
    assert json_object(b'{"model": "a", "ttl": 5}') == {"model": "a", "ttl": 5}
