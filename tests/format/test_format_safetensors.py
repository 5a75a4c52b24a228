"""safetensors header validation, on files built by hand with struct + json."""

from __future__ import annotations

import json
import re
import struct
from typing import Any

import pytest

from cartonstore.errors import InvalidCarton
from cartonstore.format.safetensors import (
    SAFETENSORS_HEADER_LIMIT,
    SafetensorsHeader,
    SafetensorsTensor,
    parse_header_size,
    parse_safetensors,
    parse_safetensors_header,
)

FILE = "model/weights.safetensors"


def build(header: dict[str, Any] | bytes, data: bytes = b"", *, pad: bool = True) -> bytes:
    """A safetensors file: 8-byte size, JSON header (space-padded to 8 bytes), data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def parse(blob: bytes) -> SafetensorsHeader:
    return parse_safetensors(blob, len(blob), file=FILE)


def tensor(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


TWO = {
    "__metadata__": {"format": "pt"},
    "b": tensor("F16", [2, 2], 16, 24),
    "a": tensor("F32", [2, 2], 0, 16),
}


def test_parses_header_sorted_by_offset() -> None:
    blob = build(TWO, bytes(24))
    header = parse(blob)
    assert header.metadata == {"format": "pt"}
    assert header.tensors == (
        SafetensorsTensor("a", "F32", (2, 2), 0, 16),
        SafetensorsTensor("b", "F16", (2, 2), 16, 24),
    )
    assert header.header_size == len(blob) - 8 - 24
    assert header.data_start == len(blob) - 24


def test_two_step_api_matches() -> None:
    blob = build(TWO, bytes(24))
    size = parse_header_size(blob[:8], len(blob), file=FILE)
    header = parse_safetensors_header(blob[8 : 8 + size], len(blob), file=FILE)
    assert header == parse(blob)


@pytest.mark.parametrize(
    ("header", "data_len"),
    [
        ({}, 0),  # no tensors at all
        ({"__metadata__": None}, 0),
        ({"s": tensor("I64", [], 0, 8)}, 8),  # 0-rank scalar
        ({"e": tensor("F32", [0, 3], 0, 0), "x": tensor("U8", [2], 0, 2)}, 2),  # empty tensor
        ({"x": tensor("U8", [2], 0, 2), "e": tensor("F32", [4, 0], 2, 2)}, 2),  # empty, at the end
        ({"f4": tensor("F4", [3, 2], 0, 3)}, 3),  # 6 x 4 bits = 3 bytes
        ({"f6": tensor("F6_E2M3", [4], 0, 3)}, 3),  # 4 x 6 bits = 3 bytes
        ({"c": tensor("C64", [1], 0, 8), "b": tensor("BOOL", [3], 8, 11)}, 11),
        ({"e8": tensor("F8_E8M0", [2], 0, 2), "bf": tensor("BF16", [1], 2, 4)}, 4),
    ],
)
def test_accepts_valid_layouts(header: dict[str, Any], data_len: int) -> None:
    parsed = parse(build(header, bytes(data_len)))
    assert len(parsed.tensors) == len([k for k in header if k != "__metadata__"])


def test_trailing_whitespace_padding_is_allowed() -> None:
    blob = build(json.dumps(TWO).encode() + b"    \n", bytes(24), pad=False)
    assert len(parse(blob).tensors) == 2


BAD = [
    # header-level problems
    (build(b"", pad=False), "header", "must start with '{'"),
    (build(b' {"a": 1}'), "header", "must start with '{'"),
    (build(b"[1]"), "header", "must start with '{'"),
    (build(b'{"a": }'), "header", "not valid JSON"),
    (build(b"{} x"), "header", "not valid JSON"),
    (build(b'{"\xff": 1}'), "header", "not valid UTF-8"),
    (build(b"{}\0\0\0\0\0\0", pad=False), "header", "not valid JSON"),
    (build(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), "header", "nested too deeply|not valid JSON"),
    (build(b'{"x": {"dtype": "U8", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 0]}}'), "header", "not valid JSON"),
    (build(b'{"x": {"dtype": "U8", "shape": [NaN], "data_offsets": [0, 0]}}'), "header", "NaN is not a JSON number"),
    (build(b'{"x": {"dtype": "U8", "shape": [Infinity], "data_offsets": [0, 0]}}'), "header", "Infinity"),
    (build(b'{"a": {}, "a": {}}'), "header", "has the key 'a' twice"),
    (build(b'{"x": {"dtype": "U8", "dtype": "U8", "shape": [], "data_offsets": [0, 1]}}', bytes(1)), "header", "'dtype' twice"),
    (build(b'{"\\ud800": {}}'), "header", "not valid Unicode"),
    # metadata
    (build({"__metadata__": {"a": 1}}), "__metadata__.a", "must be a string, not an integer"),
    (build({"__metadata__": ["a"]}), "__metadata__", "must be an object, not an array"),
    (build({"__metadata__": {"a": {"b": "c"}}}), "__metadata__.a", "must be a string, not an object"),
    (build(b'{"__metadata__": {"a": "\\udc00"}}'), "__metadata__.a", "not valid Unicode"),
    # tensor fields
    (build({"w": [1]}), "tensor 'w'", "must be an object, not an array"),
    (build({"w": {"shape": [], "data_offsets": [0, 0]}}), "tensor 'w'.dtype", "is required but missing"),
    (build({"w": {"dtype": "U8", "data_offsets": [0, 0]}}), "tensor 'w'.shape", "is required but missing"),
    (build({"w": {"dtype": "U8", "shape": []}}), "tensor 'w'.data_offsets", "is required but missing"),
    (build({"w": {**tensor("U8", [1], 0, 1), "extra": 1}}, bytes(1)), "tensor 'w'.extra", "not a tensor field"),
    (build({"w": tensor("F128", [1], 0, 16)}, bytes(16)), "tensor 'w'.dtype", "'F128' is not a safetensors dtype"),
    (build({"w": tensor("f32", [1], 0, 4)}, bytes(4)), "tensor 'w'.dtype", "not a safetensors dtype"),
    (build({"w": {**tensor("U8", [1], 0, 1), "dtype": 8}}, bytes(1)), "tensor 'w'.dtype", "an integer is not a safetensors dtype"),
    (build({"w": {**tensor("U8", [1], 0, 1), "shape": 1}}, bytes(1)), "tensor 'w'.shape", "must be a list of integers"),
    (build({"w": tensor("U8", [-1], 0, 1)}, bytes(1)), r"tensor 'w'.shape\[0\]", "not -1"),
    (build({"w": tensor("U8", [1.0], 0, 1)}, bytes(1)), r"tensor 'w'.shape\[0\]", "not a float"),
    (build({"w": tensor("U8", [True], 0, 1)}, bytes(1)), r"tensor 'w'.shape\[0\]", "not a boolean"),
    (build({"w": tensor("U8", [2**64], 0, 1)}, bytes(1)), r"tensor 'w'.shape\[0\]", "64-bit"),
    (build({"w": {**tensor("U8", [1], 0, 1), "data_offsets": [0]}}, bytes(1)), "tensor 'w'.data_offsets", r"\[begin, end\], not 1"),
    (build({"w": {**tensor("U8", [1], 0, 1), "data_offsets": [0, 1, 2]}}, bytes(1)), "tensor 'w'.data_offsets", "not 3 numbers"),
    (build({"w": {**tensor("U8", [1], 0, 1), "data_offsets": [0, 1.0]}}, bytes(1)), r"tensor 'w'.data_offsets\[1\]", "not a float"),
    (build({"w": {**tensor("U8", [1], 0, 1), "data_offsets": [0, "1"]}}, bytes(1)), r"tensor 'w'.data_offsets\[1\]", "not a string"),
    (build({"w": {**tensor("U8", [1], 0, 1), "data_offsets": None}}, bytes(1)), "tensor 'w'.data_offsets", "not null"),
    (build({"w": tensor("U8", [0], 1, 0)}, bytes(1)), "tensor 'w'.data_offsets", "begins at 1, after its end 0"),
    (build({"w": tensor("F32", [2, 2], 0, 15)}, bytes(15)), "tensor 'w'.data_offsets", r"spans 15 bytes, but a F32 tensor of shape \[2, 2\] takes 16"),
    (build({"w": tensor("F4", [3], 0, 2)}, bytes(2)), "tensor 'w'.data_offsets", "3 F4 elements do not fill a whole number of bytes"),
    (build({"w": tensor("F6_E3M2", [1], 0, 1)}, bytes(1)), "tensor 'w'.data_offsets", "whole number of bytes"),
    # layout
    (build({"w": tensor("U8", [4], 4, 8)}, bytes(8)), "tensor 'w'.data_offsets", r"leaving bytes 0\.\.4 .*\(holes are not allowed\)"),
    (build({"a": tensor("U8", [4], 0, 4), "b": tensor("U8", [4], 6, 10)}, bytes(10)), "tensor 'b'.data_offsets", "leaving bytes 4..6"),
    (build({"a": tensor("U8", [4], 0, 4), "b": tensor("U8", [4], 2, 6)}, bytes(6)), "tensor 'b'.data_offsets", r"inside tensor 'a' \(0\.\.4\)"),
    (build({"a": tensor("U8", [4], 0, 4), "b": tensor("U8", [4], 0, 4)}, bytes(4)), "tensor 'b'.data_offsets", "inside tensor 'a'"),
    (build({"a": tensor("U8", [8], 0, 8), "e": tensor("U8", [0], 4, 4)}, bytes(8)), "tensor 'e'.data_offsets", "inside tensor 'a'"),
    (build({"a": tensor("U8", [4], 0, 4)}, bytes(3)), "tensor 'a'.data_offsets", r"past the end of the data \(3 bytes\)"),
    (build({"a": tensor("U8", [4], 0, 4)}, bytes(6)), None, "2 bytes after the last tensor"),
    (build({}, b"x"), None, "1 bytes after the last tensor"),
]


@pytest.mark.parametrize(("blob", "field", "problem"), BAD)
def test_rejects_bad_files(blob: bytes, field: str | None, problem: str) -> None:
    with pytest.raises(InvalidCarton, match=problem) as info:
        parse(blob)
    assert info.value.file == FILE
    if field is None:
        assert info.value.field is None
    else:
        assert info.value.field is not None
        assert re.fullmatch(field, info.value.field)


@pytest.mark.parametrize(
    ("first8", "file_size", "problem"),
    [
        (b"", 0, "is 0 bytes, too short"),
        (b"\x08\0\0\0\0\0\0", 7, "is 7 bytes, too short"),
        (struct.pack("<Q", SAFETENSORS_HEADER_LIMIT + 1), 2**40, "over the 100000000-byte limit"),
        (struct.pack("<Q", 2**64 - 1), 2**40, "over the 100000000-byte limit"),
        (struct.pack("<Q", 100), 107, "declares a 100-byte header, but the file is only 107 bytes"),
    ],
)
def test_parse_header_size_rejects(first8: bytes, file_size: int, problem: str) -> None:
    with pytest.raises(InvalidCarton, match=problem) as info:
        parse_header_size(first8, file_size, file=FILE)
    assert info.value.file == FILE


def test_parse_header_size_accepts_limit_and_ignores_extra_bytes() -> None:
    limit = struct.pack("<Q", SAFETENSORS_HEADER_LIMIT)
    assert parse_header_size(limit, SAFETENSORS_HEADER_LIMIT + 8, file=FILE) == SAFETENSORS_HEADER_LIMIT
    assert parse_header_size(struct.pack("<Q", 2) + b"{}", 10, file=FILE) == 2


def test_parse_safetensors_needs_the_whole_header() -> None:
    blob = build(TWO, bytes(24))
    with pytest.raises(InvalidCarton, match="ends inside its"):
        parse_safetensors(blob[:20], len(blob), file=FILE)


def test_header_longer_than_file_is_rejected_by_header_parser_too() -> None:
    with pytest.raises(InvalidCarton, match="but the file is only"):
        parse_safetensors_header(b"{}", 9, file=FILE)
