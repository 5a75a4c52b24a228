"""Fuzzing the format parsers: whatever the bytes, only InvalidCarton escapes.

Each parser gets random bytes, byte-level mutations of a valid input (with
format tokens mixed in, so mutations reach past the tokenizer), and, for the
TOML and JSON formats, valid documents with one value swapped for a random
value of any type. Examples are bounded so each test takes a second or two.
"""

from __future__ import annotations

import copy
import json
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cartonstore.errors import InvalidCarton
from cartonstore.format import (
    TensorEntry,
    build_manifest,
    decode_numeric,
    decode_string,
    is_within,
    parse_carton_toml,
    parse_links,
    parse_manifest,
    parse_safetensors,
    parse_tensor_index,
    resolve_symlink_target,
    validate_carton_path,
)

FUZZ = settings(
    max_examples=250,
    deadline=None,
    database=None,  # keep the repository free of a .hypothesis directory
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SHA = "a" * 64
TOKENS = [
    b"=", b"\n", b"\r\n", b"[", b"]", b"[[", b"]]", b"{", b"}", b'"', b"'", b",", b":", b".",
    b"/", b"..", b"\\", b"\x00", b"0", b"-1", b"1.5", b"true", b"nan", b"NaN", b"1e999",
    b"9" * 30, b"\xff", b"\xc3", b"\xed\xa0\x80", b"\\ud800", b"@misc/", b"@tensor_data/", SHA.encode(),
]  # fmt: skip

TOML_SCALARS = st.one_of(
    st.none(),  # removes the key: tomli_w cannot write None
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["*", "", "@tensor_data/t0", "@misc/a.png", "@misc/../x", "float32", "nested", "x.bin"]),
    st.datetimes(),
)
TOML_VALUES = st.recursive(
    TOML_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=8),
        st.sampled_from(["F32", "U8", "F4", "__metadata__", "dtype"]),
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _apply(seed: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    data = seed
    for position, delete, insert in edits:
        at = position % (len(data) + 1)
        data = data[:at] + insert + data[at + delete :]
    return data


def mutated(seed: bytes) -> st.SearchStrategy[bytes]:
    insert = st.one_of(st.binary(max_size=6), st.sampled_from(TOKENS))
    edit = st.tuples(st.integers(0, 2**16), st.integers(0, 6), insert)
    return st.lists(edit, min_size=1, max_size=4).map(lambda edits: _apply(seed, edits))


def any_bytes(seed: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=300), mutated(seed))


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside nested dicts and lists."""
    found = [prefix] if prefix else []
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        found += _paths(child, (*prefix, key))
    return found


def swapped(document: dict[str, Any], values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``document`` with the value at one path replaced (or removed, for None)."""
    paths = _paths(document)

    def swap(path: tuple, value: Any) -> dict[str, Any]:
        data = copy.deepcopy(document)
        target = data
        for key in path[:-1]:
            target = target[key]
        if value is None and isinstance(target, dict):
            del target[path[-1]]
        elif value is not None:
            target[path[-1]] = value
        return data

    return st.builds(swap, st.sampled_from(paths), values)


def _toml(data: dict[str, Any]) -> bytes | None:
    try:
        return tomli_w.dumps(data).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        return None  # a value TOML cannot hold (e.g. a null inside an array)


def only_invalid_carton(parse: Callable[[bytes], Any], raw: bytes | None) -> None:
    if raw is None:
        return
    try:
        result = parse(raw)
    except InvalidCarton as e:
        assert e.file and e.problem and str(e).startswith(e.file)
    else:
        assert result is not None


# -- MANIFEST ----------------------------------------------------------------

MANIFEST = f"carton.toml={SHA}\nmisc/a=b.png={SHA}\nmodel/x={SHA}\n".encode()


@FUZZ
@given(any_bytes(MANIFEST))
def test_fuzz_manifest(raw: bytes) -> None:
    only_invalid_carton(parse_manifest, raw)


@FUZZ
@given(st.dictionaries(st.text(max_size=10), st.sampled_from([SHA, SHA.upper(), "x"]), max_size=4))
def test_fuzz_build_manifest_round_trips(files: dict[str, str]) -> None:
    try:
        raw = build_manifest(files)
    except InvalidCarton as e:
        assert e.file == "MANIFEST"
    else:
        assert parse_manifest(raw).as_dict() == files


# -- LINKS -------------------------------------------------------------------

LINKS_DOC = {"version": 1, "urls": {SHA: ["https://example.com/a", "https://mirror/a"]}}


@FUZZ
@given(any_bytes(_toml(LINKS_DOC) or b""))
def test_fuzz_links_bytes(raw: bytes) -> None:
    only_invalid_carton(parse_links, raw)


@FUZZ
@given(swapped(LINKS_DOC, TOML_VALUES))
def test_fuzz_links_values(document: dict[str, Any]) -> None:
    only_invalid_carton(parse_links, _toml(document))


# -- carton.toml -------------------------------------------------------------

CARTON_DOC: dict[str, Any] = {
    "spec_version": 1,
    "model_name": "m",
    "short_description": "short",
    "required_platforms": ["x86_64-unknown-linux-gnu"],
    "input": [{"name": "x", "dtype": "float32", "shape": ["n", 3]}, {"name": "y", "dtype": "string", "shape": "*"}],
    "output": [{"name": "out", "dtype": "int64", "shape": []}],
    "self_test": [{"name": "t", "inputs": {"x": "@tensor_data/t0"}, "expected_out": {"out": "@tensor_data/t1"}}],
    "example": [{"inputs": {"x": "@misc/a.png"}, "sample_out": {"out": "@tensor_data/t1"}}],
    "runner": {
        "runner_name": "torchscript",
        "required_framework_version": ">=1.12, <2",
        "runner_compat_version": 2,
        "opts": {"threads": 4, "mode": "fast"},
    },
}


@FUZZ
@given(any_bytes(_toml(CARTON_DOC) or b""))
def test_fuzz_carton_toml_bytes(raw: bytes) -> None:
    only_invalid_carton(parse_carton_toml, raw)


@FUZZ
@given(swapped(CARTON_DOC, TOML_VALUES))
def test_fuzz_carton_toml_values(document: dict[str, Any]) -> None:
    def parse(raw: bytes) -> Any:
        config = parse_carton_toml(raw)
        config.tensor_references()
        config.misc_references()
        return config

    only_invalid_carton(parse, _toml(document))


# -- tensor_data -------------------------------------------------------------

INDEX_DOC: dict[str, Any] = {
    "tensor": [
        {"name": "a", "dtype": "float32", "shape": [2], "file": "tensor_0.bin", "inner": []},
        {"name": "s", "dtype": "string", "shape": [1], "file": "tensor_1.toml"},
        {"name": "n", "dtype": "nested", "inner": ["a", "s"]},
    ]
}


@FUZZ
@given(any_bytes(_toml(INDEX_DOC) or b""))
def test_fuzz_tensor_index_bytes(raw: bytes) -> None:
    only_invalid_carton(parse_tensor_index, raw)


@FUZZ
@given(swapped(INDEX_DOC, TOML_VALUES))
def test_fuzz_tensor_index_values(document: dict[str, Any]) -> None:
    only_invalid_carton(parse_tensor_index, _toml(document))


@FUZZ
@given(
    st.sampled_from(["float32", "int8", "uint64", "float64"]),
    st.lists(st.integers(0, 2**62), max_size=4),
    st.binary(max_size=64),
)
def test_fuzz_decode_numeric(dtype: str, shape: list[int], data: bytes) -> None:
    entry = TensorEntry("t", dtype, tuple(shape), "t.bin", None)
    only_invalid_carton(lambda raw: decode_numeric(entry, raw), data)


@FUZZ
@given(st.lists(st.integers(0, 3), max_size=3), any_bytes(b'data = ["a", "b \\u00e9", "c"]\n'))
def test_fuzz_decode_string(shape: list[int], raw: bytes) -> None:
    entry = TensorEntry("s", "string", tuple(shape), "s.toml", None)

    def parse(data: bytes) -> np.ndarray:
        array = decode_string(entry, data)
        assert array.shape == tuple(shape)
        return array

    only_invalid_carton(parse, raw)


# -- safetensors -------------------------------------------------------------

ST_DOC: dict[str, Any] = {
    "__metadata__": {"format": "pt"},
    "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "F16", "shape": [1, 2], "data_offsets": [8, 12]},
    "e": {"dtype": "U8", "shape": [0], "data_offsets": [12, 12]},
}


def _safetensors(header: bytes, data_len: int = 12) -> bytes:
    return struct.pack("<Q", len(header)) + header + bytes(data_len)


def _parse_safetensors(blob: bytes) -> Any:
    return parse_safetensors(blob, len(blob), file="model/w.safetensors")


@FUZZ
@given(any_bytes(_safetensors(json.dumps(ST_DOC).encode())))
def test_fuzz_safetensors_bytes(blob: bytes) -> None:
    only_invalid_carton(_parse_safetensors, blob)


@FUZZ
@given(swapped(ST_DOC, JSON_VALUES), st.integers(0, 16))
def test_fuzz_safetensors_values(document: dict[str, Any], data_len: int) -> None:
    only_invalid_carton(_parse_safetensors, _safetensors(json.dumps(document).encode(), data_len))


# -- GGUF headers ---------------------------------------------------------------

def _gguf_seed() -> bytes:
    def text(t: bytes) -> bytes:
        return struct.pack("<Q", len(t)) + t

    kvs = [text(b"general.architecture") + struct.pack("<I", 8) + text(b"llama"),
           text(b"general.file_type") + struct.pack("<II", 4, 15),
           text(b"tokens") + struct.pack("<IIQ", 9, 8, 20) + b"".join(text(b"t%d" % i) for i in range(20)),
           text(b"flags") + struct.pack("<IIQ", 9, 7, 3) + b"\0\1\0"]
    tensor = text(b"w") + struct.pack("<IQQIQ", 2, 4, 2, 0, 0)
    return b"GGUF" + struct.pack("<IQQ", 3, 1, len(kvs)) + b"".join(kvs) + tensor + bytes(64)


@FUZZ
@given(any_bytes(_gguf_seed()))
def test_fuzz_gguf_bytes(blob: bytes) -> None:
    from cartonstore.format.gguf import parse_gguf_bytes

    only_invalid_carton(lambda raw: parse_gguf_bytes(raw, file="model/m.gguf"), blob)


# -- ONNX graphs -----------------------------------------------------------------

def _onnx_seed() -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, None])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])
    s = helper.make_tensor_sequence_value_info("s", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, None])
    sparse = helper.make_sparse_tensor(helper.make_tensor("v", TensorProto.FLOAT, [1], [5.0]),
                                       helper.make_tensor("i", TensorProto.INT64, [1], [2]), [4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x, w, s], [y],
                              [helper.make_tensor("w", TensorProto.FLOAT, [4], [1, 2, 3, 4])],
                              sparse_initializer=[sparse])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def _parse_onnx(raw: bytes) -> Any:
    from cartonstore.format.onnx_graph import parse_onnx_graph_bytes

    return parse_onnx_graph_bytes(raw, file="model/m.onnx")


def _protobuf_fields() -> st.SearchStrategy[bytes]:
    """Messages of random fields, numbered as ONNX's are, nested."""
    from kit.modelfiles import protobuf_field

    number = st.integers(1, 16)
    leaf = st.one_of(st.builds(protobuf_field, number, st.integers(0, 2**64 - 1)),
                     st.builds(protobuf_field, number, st.binary(max_size=6)),
                     st.builds(protobuf_field, number, st.binary(max_size=8), st.sampled_from([1, 3, 5, 6])))
    return st.recursive(leaf, lambda inner: st.builds(protobuf_field, number, st.lists(inner, max_size=4).map(
        b"".join)), max_leaves=16)


@FUZZ
@given(any_bytes(_onnx_seed()))
def test_fuzz_onnx_graph_bytes(blob: bytes) -> None:
    only_invalid_carton(_parse_onnx, blob)


@FUZZ
@given(st.lists(_protobuf_fields(), max_size=6).map(b"".join))
def test_fuzz_onnx_graph_fields(blob: bytes) -> None:
    from kit.modelfiles import protobuf_field

    only_invalid_carton(_parse_onnx, protobuf_field(1, 8) + protobuf_field(7, blob))   # a graph of anything


# -- paths -------------------------------------------------------------------

PATH_PARTS = [*"ab/.\\:\x00 é", "..", "\udc80"]
PATH_TEXT = st.lists(st.sampled_from(PATH_PARTS), max_size=10).map("".join)


@FUZZ
@given(PATH_TEXT)
def test_fuzz_paths(name: str) -> None:
    try:
        assert validate_carton_path(name) == name
    except InvalidCarton:
        return
    assert is_within("", name)
    assert all(part not in ("", ".", "..") for part in name.split("/"))


@FUZZ
@given(st.sampled_from(["model/link", "model/a/b/link", "link", "misc/x"]), PATH_TEXT)
def test_fuzz_symlinks_never_escape(link: str, target: str) -> None:
    try:
        resolved = resolve_symlink_target(link, target)
    except InvalidCarton as e:
        assert e.file == link
        return
    assert validate_carton_path(resolved) == resolved
    top = link.split("/")[0] if "/" in link else ""
    assert is_within(top, resolved) and resolved != top
