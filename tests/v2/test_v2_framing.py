"""The binary tensor data extension codec: round trips for every datatype,
interop with the real tritonclient package in both directions, raw binary
requests, zero-copy, and a clear InvalidInput for each malformed body."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as triton_http
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cartonstore.errors import InvalidInput
from cartonstore.format.dtypes import carton_dtype_to_v2, v2_to_carton_dtype
from cartonstore.v2.datatypes import (
    ELEMENT_SIZES,
    datatype_of,
    element_size,
    numpy_dtype,
)
from cartonstore.v2.framing import (
    InferRequest,
    encode_infer_request,
    encode_infer_response,
    numpy_to_binary,
    numpy_to_json_data,
    parse_infer_request,
    parse_infer_response,
    parse_raw_binary_request,
    tensor_to_numpy,
)
from cartonstore.v2.shared_memory import RegionTooSmall, ShmRef, ShmSink

NUMERIC = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
}
ALL_DATATYPES = [*NUMERIC, "BYTES"]


def sample(datatype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    count = int(np.prod(shape))
    if datatype == "BYTES":
        items = [b"", b"a", "h\u00e9llo".encode(), b"x" * 40, b"0", b"zz"]
        return np.array((items * count)[:count], dtype=object).reshape(shape)
    if datatype == "BOOL":
        return (np.arange(count) % 3 == 0).reshape(shape)
    values = np.arange(count) if datatype.startswith("UINT") else np.arange(count) * 3 - 2
    return values.astype(NUMERIC[datatype]).reshape(shape)


def join(parts: list) -> bytes:
    return b"".join(bytes(p) for p in parts)


def assert_same(got: np.ndarray, want: np.ndarray, *, exact: bool = True) -> None:
    assert got.shape == want.shape
    if want.dtype == object:
        assert got.dtype == object
        assert got.tolist() == want.tolist()
    else:
        assert got.dtype == want.dtype
        if exact:  # binary data: bit for bit
            assert got.tobytes() == want.tobytes()
        else:  # through JSON floats: NaN payloads need not survive
            np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- datatypes


@pytest.mark.parametrize(
    ("datatype", "size", "dtype"),
    [("BOOL", 1, np.bool_), ("INT64", 8, np.int64), ("FP16", 2, np.float16), ("BF16", 2, ml_dtypes.bfloat16),
     ("UINT32", 4, np.uint32), ("BYTES", None, object)],
)
def test_datatype_table(datatype, size, dtype) -> None:
    assert element_size(datatype) == size
    assert numpy_dtype(datatype) == np.dtype(dtype)


@pytest.mark.parametrize(
    ("array", "datatype"),
    [(np.zeros(2, np.float32), "FP32"), (np.zeros(2, ">f4"), "FP32"), (np.zeros(2, bool), "BOOL"),
     (np.array(["a"]), "BYTES"), (np.array([b"a"]), "BYTES"), (np.array([b"a"], dtype=object), "BYTES"),
     (np.zeros(2, ml_dtypes.bfloat16), "BF16"), (np.zeros(2, np.uint64), "UINT64")],
)
def test_datatype_of(array, datatype) -> None:
    assert datatype_of(array) == datatype


def test_datatype_of_refuses_complex() -> None:
    with pytest.raises(InvalidInput, match="complex64"):
        datatype_of(np.zeros(2, np.complex64))
    with pytest.raises(InvalidInput, match="input 'c': numpy dtype complex64 has no KServe v2 datatype"):
        encode_infer_request({"c": np.zeros(2, np.complex64)})


@pytest.mark.parametrize(("carton", "v2"), [("float32", "FP32"), ("string", "BYTES"), ("uint64", "UINT64")])
def test_carton_mapping(carton, v2) -> None:
    assert carton_dtype_to_v2(carton) == v2
    assert v2_to_carton_dtype(v2) == carton


@pytest.mark.parametrize("bad", ["FP16", "BF16", "BOOL", "fp32"])
def test_v2_to_carton_refuses_unmapped(bad) -> None:
    with pytest.raises(InvalidInput, match=bad):
        v2_to_carton_dtype(bad)


# ---------------------------------------------------------------- round trips


def arrays_for(datatype: str) -> st.SearchStrategy[np.ndarray]:
    if datatype == "BYTES":
        element = st.binary(max_size=20)
        return hnp.arrays(object, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4), elements=element)
    if datatype == "BF16":
        bits = hnp.arrays(np.uint16, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
        return bits.map(lambda a: a.view(ml_dtypes.bfloat16))
    return hnp.arrays(np.dtype(NUMERIC[datatype]), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_round_trip_every_datatype(datatype) -> None:
    @settings(max_examples=40, deadline=None)
    @given(array=arrays_for(datatype), binary=st.booleans())
    def check(array, binary) -> None:
        if datatype == "BYTES" and not binary:
            array = np.vectorize(lambda b: b.decode("latin-1").encode("utf-8"), otypes=[object])(array) \
                if array.size else array
        exact = binary or datatype in ("FP16", "BF16")  # these go binary regardless
        parts, header_length = encode_infer_request({"t": array}, binary=binary, request_id="r1")
        request = parse_infer_request(join(parts), header_length)
        assert request.id == "r1"
        (tensor,) = request.inputs
        assert tensor.datatype == datatype and tensor.shape == list(array.shape)
        assert_same(tensor_to_numpy(tensor), array, exact=exact)

        parts, header_length = encode_infer_response(
            model_name="m", model_version="1", request_id="r1", outputs={"o": array}, binary=lambda _: binary
        )
        doc, outputs = parse_infer_response(join(parts), header_length)
        assert doc["model_name"] == "m" and doc["id"] == "r1"
        assert_same(outputs["o"], array, exact=exact)

    check()


def test_json_request_needs_no_header_length() -> None:
    parts, header_length = encode_infer_request({"x": np.ones(3, np.int32)}, binary=False)
    assert header_length is None and len(parts) == 1
    assert json.loads(parts[0])["inputs"][0]["data"] == [1, 1, 1]


def test_fp16_goes_binary_even_when_json_is_asked() -> None:
    parts, header_length = encode_infer_request({"h": np.ones(2, np.float16)}, binary=False)
    assert header_length == len(parts[0])
    assert json.loads(parts[0])["inputs"][0]["parameters"] == {"binary_data_size": 4}


def test_requested_outputs_and_wants_binary() -> None:
    parts, header_length = encode_infer_request(
        {"x": np.ones(1, np.float32)}, outputs=["a", "b"], binary_outputs=False, parameters={"k": 1}
    )
    request = parse_infer_request(join(parts), header_length)
    assert [o.name for o in request.outputs] == ["a", "b"]
    assert request.parameters == {"k": 1}
    assert request.wants_binary("a") is False
    doc = {"inputs": [], "outputs": [{"name": "a", "parameters": {"binary_data": True}}, {"name": "b"}],
           "parameters": {"binary_data_output": False}}
    request = parse_infer_request(json.dumps(doc).encode(), None)
    assert request.wants_binary("a") is True and request.wants_binary("b") is False
    doc["parameters"]["binary_data_output"] = True
    request = parse_infer_request(json.dumps(doc).encode(), None)
    assert request.wants_binary("b") is True and request.wants_binary("zzz") is True
    assert parse_infer_request(b'{"inputs":[],"outputs":[]}', None).outputs is None


def test_spec_example_request() -> None:
    header = json.dumps({
        "model_name": "mymodel",
        "inputs": [
            {"name": "input0", "shape": [2, 2], "datatype": "UINT32", "parameters": {"binary_data_size": 16}},
            {"name": "input1", "shape": [3], "datatype": "BOOL", "parameters": {"binary_data_size": 3}},
        ],
        "outputs": [{"name": "output0", "parameters": {"binary_data": True}}],
    }).encode()
    body = header + np.array([1, 2, 3, 4], "<u4").tobytes() + bytes([1, 0, 1])
    request = parse_infer_request(memoryview(body), len(header))
    assert tensor_to_numpy(request.inputs[0]).tolist() == [[1, 2], [3, 4]]
    assert tensor_to_numpy(request.inputs[1]).tolist() == [True, False, True]
    assert request.wants_binary("output0")


def test_nested_json_data_is_row_major() -> None:
    doc = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]}]}
    request = parse_infer_request(json.dumps(doc).encode(), None)
    assert tensor_to_numpy(request.inputs[0]).tolist() == [[1, 2], [3, 4]]


# ---------------------------------------------------------------- tritonclient interop


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_tritonclient_request_parses(datatype, binary) -> None:
    if not binary and datatype in ("BF16",):
        pytest.skip("tritonclient itself refuses BF16 as JSON")
    array = sample(datatype)
    infer_input = triton_http.InferInput("in0", list(array.shape), datatype)
    infer_input.set_data_from_numpy(array, binary_data=binary)
    other = triton_http.InferInput("in1", [2], "INT64")
    other.set_data_from_numpy(np.array([7, -8], np.int64), binary_data=True)
    outputs = [triton_http.InferRequestedOutput("out0", binary_data=False),
               triton_http.InferRequestedOutput("out1", binary_data=True)]
    body, header_length = triton_http.InferenceServerClient.generate_request_body(
        [infer_input, other], outputs=outputs, request_id="abc"
    )
    request = parse_infer_request(body, header_length)
    assert request.id == "abc"
    assert [t.name for t in request.inputs] == ["in0", "in1"]
    assert request.wants_binary("out0") is False and request.wants_binary("out1") is True
    assert tensor_to_numpy(request.inputs[1]).tolist() == [7, -8]
    if datatype == "FP16" and not binary:
        with pytest.raises(InvalidInput, match="input 'in0': FP16 data cannot be sent as JSON"):
            tensor_to_numpy(request.inputs[0])
        return
    assert_same(tensor_to_numpy(request.inputs[0]), array)


def test_tritonclient_request_without_outputs_asks_binary() -> None:
    infer_input = triton_http.InferInput("x", [1], "FP32").set_data_from_numpy(np.ones(1, np.float32))
    body, header_length = triton_http.InferenceServerClient.generate_request_body([infer_input])
    assert parse_infer_request(body, header_length).wants_binary("anything")


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_response_decodes_with_tritonclient(datatype, binary) -> None:
    array = sample(datatype)
    parts, header_length = encode_infer_response(
        model_name="m", model_version="3", request_id=None,
        outputs={"o": array, "p": np.arange(3, dtype=np.float32)}, binary=lambda name: binary,
    )
    result = triton_http.InferenceServerClient.parse_response_body(join(parts), header_length=header_length)
    got = result.as_numpy("o")
    if datatype == "BYTES" and not binary:
        # Triton hands JSON BYTES back to the client as str, as it does here.
        assert got.tolist() == [[b.decode() for b in row] for row in array.tolist()]
    else:
        assert_same(got, array)
    assert result.as_numpy("p").tolist() == [0.0, 1.0, 2.0]
    assert result.get_response()["model_version"] == "3"


def test_empty_binary_tensor_with_tritonclient() -> None:
    parts, header_length = encode_infer_response(
        model_name="m", model_version=None, request_id=None,
        outputs={"e": np.zeros((0, 3), np.float32), "s": np.zeros(0, object)}, binary=lambda _: True,
    )
    result = triton_http.InferResult.from_response_body(join(parts), header_length=header_length)
    assert result.as_numpy("e").shape == (0, 3)
    assert result.as_numpy("s").shape == (0,)


# ---------------------------------------------------------------- raw binary


def test_raw_binary_deduces_the_variable_dimension() -> None:
    body = np.arange(12, dtype=np.float32).tobytes()
    request = parse_raw_binary_request(body, input_name="x", datatype="FP32", dims=[-1, 3])
    assert isinstance(request, InferRequest) and request.binary_data_output
    assert request.wants_binary("whatever")
    assert tensor_to_numpy(request.inputs[0]).shape == (4, 3)


def test_raw_binary_bytes_gets_its_length_prefix() -> None:
    request = parse_raw_binary_request(b"hello\x00", input_name="s", datatype="BYTES", dims=[1])
    assert tensor_to_numpy(request.inputs[0]).tolist() == [b"hello\x00"]


@pytest.mark.parametrize(
    ("body", "datatype", "dims", "message"),
    [
        (b"\0" * 16, "FP32", [-1, -1], "at most one variable dimension"),
        (b"\0" * 10, "FP32", [-1], "not a multiple of 4 bytes"),
        (b"\0" * 12, "FP32", [4], "binary_data_size 12 does not match shape [4] of FP32 (16 bytes)"),
        (b"\0" * 4, "FP32", [-1, 0], "not a multiple of 0 bytes"),
        (b"ab", "BYTES", [2], "needs the input's shape to be [1]"),
        (b"ab", "BYTES", [-1], "needs the input's shape to be [1]"),
        (b"ab", "FP99", [1], "unknown datatype 'FP99'"),
    ],
)
def test_raw_binary_errors(body, datatype, dims, message) -> None:
    with pytest.raises(InvalidInput, match=r"input 'x'.*") as info:
        parse_raw_binary_request(body, input_name="x", datatype=datatype, dims=dims)
    assert message in str(info.value)


# ---------------------------------------------------------------- zero copy


def test_binary_tensors_are_not_copied() -> None:
    big = np.arange(1 << 20, dtype=np.float32)
    chunk = numpy_to_binary(big)
    assert isinstance(chunk, memoryview) and np.shares_memory(np.frombuffer(chunk, np.uint8), big)
    parts, header_length = encode_infer_request({"big": big})
    assert parts[1] is not None and np.shares_memory(np.frombuffer(parts[1], np.uint8), big)
    body = join(parts)
    array = tensor_to_numpy(parse_infer_request(body, header_length).inputs[0])
    assert np.shares_memory(array, np.frombuffer(body, np.uint8))
    assert not array.flags.writeable


def test_numpy_to_binary_converts_byte_order_and_casts_same_kind() -> None:
    assert bytes(numpy_to_binary(np.array([1.0], ">f4"))) == struct.pack("<f", 1.0)
    assert bytes(numpy_to_binary(np.array([1.0]), "FP32")) == struct.pack("<f", 1.0)
    with pytest.raises(InvalidInput, match="float64 cannot be sent as INT32"):
        numpy_to_binary(np.array([1.5]), "INT32")


@pytest.mark.parametrize(
    ("array", "datatype", "expected"),
    [(np.array([[1, 2]], np.int8), None, [1, 2]), (np.array([True]), None, [True]),
     (np.array([b"a", "b"], object), None, ["a", "b"]), (np.array([1.5], np.float64), "FP32", [1.5])],
)
def test_numpy_to_json_data(array, datatype, expected) -> None:
    assert numpy_to_json_data(array, datatype) == expected


@pytest.mark.parametrize(
    ("array", "message"),
    [(np.array([b"\xff"], object), "not valid UTF-8"), (np.ones(1, np.float16), "FP16 data cannot be sent as JSON"),
     (np.ones(1, ml_dtypes.bfloat16), "BF16"), (np.array(["a", 1], object), "element 1 is int")],
)
def test_numpy_to_json_data_errors(array, message) -> None:
    with pytest.raises(InvalidInput, match=message):
        numpy_to_json_data(array)


# ---------------------------------------------------------------- malformed bodies


def body_of(inputs: list, binary: bytes = b"", **extra) -> tuple[bytes, int | None]:
    header = json.dumps({"inputs": inputs, **extra}).encode()
    return header + binary, (len(header) if binary else None)


def fp32(name="x", size=None, shape=(2,), **more) -> dict[str, object]:
    entry = {"name": name, "datatype": "FP32", "shape": list(shape), **more}
    if size is not None:
        entry["parameters"] = {"binary_data_size": size}
    return entry


BAD_REQUESTS = [
    ((b"{not json", None), "infer request: JSON is not valid"),
    ((b"[1, 2]", None), "infer request: JSON must be an object"),
    ((b"{}", None), '"inputs" is missing'),
    ((b'{"inputs": {}}', None), '"inputs" must be a JSON array'),
    ((b'{"inputs": [], "id": 5}', None), '"id" must be a string'),
    ((b'{"inputs": [], "parameters": {"binary_data_output": 1}}', None), "binary_data_output must be true or false"),
    (body_of([fp32(size=8)], b"\0" * 8), None),
    (body_of([fp32(size=8)], b"\0" * 7), "input 'x': binary_data_size 8 runs past the end of the body"),
    (body_of([fp32(size=8)], b"\0" * 9), "body has 1 bytes after the binary data of the inputs"),
    (body_of([fp32(size=8)]), "input 'x': binary_data_size 8 given but the body is all JSON"),
    (body_of([fp32(size=-1)], b"\0"), "input 'x': binary_data_size must be an integer >= 0"),
    (body_of([fp32(size=True)], b"\0"), "input 'x': binary_data_size must be an integer >= 0"),
    (body_of([fp32(size=8, data=[1, 2])], b"\0" * 8), "input 'x': has both \"data\" and"),
    (body_of([fp32()]), "input 'x': has neither \"data\" nor"),
    (body_of([fp32(data=3)]), "input 'x': \"data\" must be a JSON array"),
    (body_of([fp32(shape=(-1,), data=[])]), "input 'x': \"shape\" must be an array of integers >= 0"),
    (body_of([fp32(shape=(1.0,), data=[])]), "input 'x': \"shape\" must be an array of integers >= 0"),
    (body_of([{"name": "x", "datatype": "FP8", "shape": [1], "data": [1]}]), "input 'x': unknown datatype 'FP8'"),
    (body_of([{"datatype": "FP32", "shape": [1], "data": [1]}]), "input #0: \"name\" must be a non-empty string"),
    (body_of([3]), "input #0: must be a JSON object"),
    (body_of([fp32(data=[1, 2], parameters=[])]), "input 'x': \"parameters\" must be a JSON object"),
    (body_of([fp32(parameters={"shared_memory_region": "r"})]),
     "input 'x': shared_memory_region and shared_memory_byte_size must be given together (given: shared_memory_region)"),
    (body_of([fp32(parameters={"shared_memory_offset": 8})]), "must be given together (given: shared_memory_offset)"),
    (body_of([fp32(parameters={"shared_memory_region": "", "shared_memory_byte_size": 8})]),
     "input 'x': shared_memory_region must be a non-empty string"),
    (body_of([fp32(parameters={"shared_memory_region": "r", "shared_memory_byte_size": -8})]),
     "input 'x': shared_memory_byte_size must be an integer >= 0, not -8"),
    (body_of([fp32(parameters={"shared_memory_region": "r", "shared_memory_byte_size": 8,
                               "shared_memory_offset": "4"})]),
     "input 'x': shared_memory_offset must be an integer >= 0, not '4'"),
    (body_of([fp32(data=[1, 2], parameters={"shared_memory_region": "r", "shared_memory_byte_size": 8})]),
     "input 'x': names a shared memory region and also has \"data\""),
    (body_of([fp32(parameters={"shared_memory_region": "r", "shared_memory_byte_size": 8, "binary_data_size": 8})],
             b"\0" * 8),
     "input 'x': names a shared memory region and also has binary_data_size"),
    (body_of([], outputs=[{"name": "o", "parameters": {"shared_memory_byte_size": 8}}]),
     "requested output 'o': shared_memory_region and shared_memory_byte_size must be given together"),
    (body_of([], outputs=[{"name": "o"}, {"name": "o"}]), "requested output 'o': is requested twice"),
    (body_of([], outputs=[{"name": "o", "parameters": {"binary_data": "yes"}}]), "binary_data must be true or false"),
    (body_of([], outputs=[{}]), "requested output #0: \"name\""),
]


@pytest.mark.parametrize(("request_body", "message"), BAD_REQUESTS)
def test_malformed_requests(request_body, message) -> None:
    body, header_length = request_body
    if message is None:
        parse_infer_request(body, header_length)
        return
    with pytest.raises(InvalidInput) as info:
        parse_infer_request(body, header_length)
    assert message in str(info.value)


@pytest.mark.parametrize(("header_length", "message"), [(0, "must be a positive integer"), (-3, "must be a positive"),
                                                        (999, "larger than the")])
def test_bad_header_length(header_length, message) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_infer_request(b'{"inputs": []}', header_length)


BAD_TENSORS = [
    (fp32(size=8, shape=(3,)), b"\0" * 8, "input 'x': binary_data_size 8 does not match shape [3] of FP32 (12 bytes)"),
    ({"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 6}},
     b"\1\0\0\0a\0", "input 's': BYTES element 1 at byte 5 has a truncated length prefix"),
    ({"name": "s", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}},
     b"\x09\0\0\0ab", "input 's': BYTES element 0 claims 9 bytes but only 2 remain"),
    ({"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 5}},
     b"\1\0\0\0a", "input 's': shape [2] needs 2 elements but there are 1 BYTES elements"),
    ({"name": "b", "datatype": "BOOL", "shape": [2], "parameters": {"binary_data_size": 2}},
     b"\1\2", "input 'b': BOOL binary data must be bytes 0 or 1"),
    (fp32(data=[1.0]), b"", "input 'x': shape [2] needs 2 elements but there are 1 values in its JSON data"),
    (fp32(data=[1.0, "2"]), b"", "input 'x': FP32 JSON data must be numbers, but element 1 is a string"),
    (fp32(data=[1.0, True]), b"", "element 1 is a boolean"),
    ({"name": "i", "datatype": "INT8", "shape": [1], "data": [1.5]}, b"", "INT8 JSON data must be integers"),
    ({"name": "i", "datatype": "UINT8", "shape": [2], "data": [1, 256]}, b"",
     "input 'i': JSON value 256 is out of range for UINT8 [0, 255]"),
    ({"name": "b", "datatype": "BOOL", "shape": [1], "data": [1]}, b"", "BOOL JSON data must be true or false"),
    ({"name": "s", "datatype": "BYTES", "shape": [1], "data": [1]}, b"", "BYTES JSON data must be strings"),
    ({"name": "h", "datatype": "BF16", "shape": [1], "data": [1.0]}, b"", "BF16 data cannot be sent as JSON"),
]


@pytest.mark.parametrize(("entry", "binary", "message"), BAD_TENSORS)
def test_bad_tensor_data_is_refused_by_tensor_to_numpy(entry, binary, message) -> None:
    body, header_length = body_of([entry], binary)
    request = parse_infer_request(body, header_length)
    with pytest.raises(InvalidInput) as info:
        tensor_to_numpy(request.inputs[0])
    assert message in str(info.value)


@pytest.mark.parametrize(("body", "header_length", "message"), [
    (b'{"outputs": [{"name": "o", "datatype": "INT8", "shape": [1], "data": [1]},'
     b' {"name": "o", "datatype": "INT8", "shape": [1], "data": [1]}]}', None, "output 'o': appears twice"),
    (b'{"outputs": [{"name": "o", "datatype": "INT8", "shape": [2], "parameters": {"binary_data_size": 2}}]}',
     None, "output 'o': binary_data_size 2 given but the body is all JSON"),
])
def test_bad_responses(body, header_length, message) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_infer_response(body, header_length)
    assert message in str(info.value)


def test_element_sizes_cover_every_datatype() -> None:
    assert set(ELEMENT_SIZES) == set(ALL_DATATYPES)


def test_a_repeated_key_is_refused_not_resolved() -> None:
    # Python keeps the last "inputs", a rapidjson runner the first: the daemon
    # must not validate one request and forward another.
    body = b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}], "inputs": []}'
    with pytest.raises(InvalidInput, match="'inputs' appears twice"):
        parse_infer_request(body, None)


def test_shared_memory_tensors_are_parsed_without_data() -> None:
    body = json.dumps({"inputs": [fp32(shape=(4,), parameters={"shared_memory_region": "in", "shared_memory_byte_size": 16,
                                                             "shared_memory_offset": 64})],
                       "outputs": [{"name": "y", "parameters": {"shared_memory_region": "out",
                                                                "shared_memory_byte_size": 32}},
                                   {"name": "z"}]}).encode()
    req = parse_infer_request(body, None)
    (x,) = req.inputs
    assert (x.data, x.json_data, x.shm) == (None, None, ShmRef("in", 64, 16))
    assert x.shm.end == 80
    assert req.shm_outputs() == {"y": ShmRef("out", 0, 32)}


def test_outputs_written_into_shared_memory_and_a_region_too_small() -> None:
    region = bytearray(32)
    parts, header_length = encode_infer_response(
        model_name="m", model_version="1", request_id=None,
        outputs={"y": np.arange(4, dtype=np.float32), "z": np.ones(2, np.int8)}, binary=lambda _: True,
        sinks={"y": ShmSink("out", memoryview(region)[8:24])})
    header = json.loads(parts[0])
    assert header["outputs"][0]["parameters"] == {"shared_memory_region": "out", "shared_memory_byte_size": 16}
    assert "data" not in header["outputs"][0]
    assert np.frombuffer(region[8:24], np.float32).tolist() == [0, 1, 2, 3]
    assert bytes(parts[1]) == b"\1\1" and header_length == len(parts[0])
    with pytest.raises(RegionTooSmall, match="output 'y': shared memory region 'out' gives it 8 bytes, but it needs 16"):
        encode_infer_response(model_name="m", model_version=None, request_id=None,
                              outputs={"y": np.arange(4, dtype=np.float32)}, binary=lambda _: True,
                              sinks={"y": ShmSink("out", memoryview(region)[:8])})
    _, arrays = parse_infer_response(b"".join(bytes(p) for p in parts), header_length)
    assert list(arrays) == ["z"]   # the shared-memory output is the caller's to read from its region
