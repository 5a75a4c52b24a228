"""Checks on a tensor's payload that need no numpy: the size arithmetic of
binary numeric data, the 4-byte length framing of binary BYTES data, and the
element types of JSON data.

These are shared by the daemon's request validation (which must stay cheap:
it runs on the event loop for every request) and by the decoding into numpy
arrays (which must refuse the same things).
"""

from __future__ import annotations

import struct
from math import prod
from typing import Any

from cartonstore.errors import InvalidInput

from .datatypes import BINARY_ONLY_DATATYPES, ELEMENT_SIZES

_LENGTH = struct.Struct("<I")

# Inclusive bounds of each integer datatype, for JSON numbers.
INTEGER_RANGES: dict[str, tuple[int, int]] = {
    "UINT8": (0, 2**8 - 1),
    "UINT16": (0, 2**16 - 1),
    "UINT32": (0, 2**32 - 1),
    "UINT64": (0, 2**64 - 1),
    "INT8": (-(2**7), 2**7 - 1),
    "INT16": (-(2**15), 2**15 - 1),
    "INT32": (-(2**31), 2**31 - 1),
    "INT64": (-(2**63), 2**63 - 1),
}


def fail(what: str, problem: str) -> InvalidInput:
    return InvalidInput(f"{what}: {problem}", subject=what)


def shape_text(shape: list[int]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def check_numeric_size(what: str, datatype: str, shape: list[int], size: int,
                       field: str = "binary_data_size") -> None:
    """Binary numeric data must hold exactly prod(shape) elements."""
    expected = prod(shape) * ELEMENT_SIZES[datatype]  # type: ignore[operator]  # a numeric datatype has a size
    if size != expected:
        raise fail(
            what,
            f"{field} {size} does not match shape {shape_text(shape)} "
            f"of {datatype} ({expected} bytes)",
        )


def walk_bytes_framing(what: str, buf: memoryview | bytes, *, keep: bool) -> tuple[int, list[bytes]]:
    """Walk BYTES binary data (<u4 length, then that many bytes, per element).

    Returns the element count and, when ``keep``, the elements. The framing
    must consume the buffer exactly.
    """
    unpack = _LENGTH.unpack_from
    end = len(buf)
    offset = 0
    count = 0
    elements: list[bytes] = []
    while offset < end:
        if end - offset < 4:
            raise fail(
                what,
                f"BYTES element {count} at byte {offset} has a truncated length prefix "
                f"({end - offset} of 4 bytes)",
            )
        (length,) = unpack(buf, offset)
        offset += 4
        if length > end - offset:
            raise fail(
                what,
                f"BYTES element {count} claims {length} bytes but only "
                f"{end - offset} remain in its binary data",
            )
        if keep:
            elements.append(bytes(buf[offset : offset + length]))
        offset += length
        count += 1
    return count, elements


def check_bytes_framing(what: str, shape: list[int], buf: memoryview | bytes) -> None:
    count, _ = walk_bytes_framing(what, buf, keep=False)
    _check_count(what, shape, count, "BYTES elements in its binary data")


def split_bytes_framing(what: str, shape: list[int], buf: memoryview | bytes) -> list[bytes]:
    count, elements = walk_bytes_framing(what, buf, keep=True)
    _check_count(what, shape, count, "BYTES elements in its binary data")
    return elements


def _check_count(what: str, shape: list[int], count: int, found: str) -> None:
    expected = prod(shape)
    if count != expected:
        raise fail(
            what, f"shape {shape_text(shape)} needs {expected} elements but there are {count} {found}"
        )


def flatten_json_data(what: str, data: Any) -> tuple[list[Any], set[type]]:
    """The JSON "data" as a flat row-major list (nested arrays are allowed),
    and the types of its elements."""
    if type(data) is not list:
        raise fail(what, f"data must be a JSON array, not {_json_type(data)}")
    # One pass of map(type) in C says what is there: a million numbers are
    # neither walked in Python nor typed twice.
    kinds = set(map(type, data))
    if list not in kinds:
        return data, kinds
    flat: list[Any] = []
    _flatten_into(data, flat)
    return flat, set(map(type, flat))


def _flatten_into(data: list[Any], flat: list[Any]) -> None:
    for item in data:
        if type(item) is list:
            _flatten_into(item, flat)
        else:
            flat.append(item)


def check_json_data(what: str, datatype: str, shape: list[int], data: Any, *,
                    numbers_only: bool = False) -> list[Any]:
    """Check JSON data against its datatype and shape; return it flattened.
    ``numbers_only``: the parser found ``data`` to be a flat list of ints and
    floats alone, which is all a float datatype asks of its elements (and
    such ints, from orjson, are at most 64 bits: they cannot overflow)."""
    if datatype in BINARY_ONLY_DATATYPES:
        raise fail(what, f"{datatype} data cannot be sent as JSON (binary only); use binary_data_size")
    if numbers_only and datatype in _FLOAT_DATATYPES and type(data) is list:
        _check_count(what, shape, len(data), "values in its JSON data")
        return data
    flat, kinds = flatten_json_data(what, data)
    _check_count(what, shape, len(flat), "values in its JSON data")
    if not flat:
        return flat
    if datatype == "BOOL":
        _check_types(what, datatype, flat, kinds, (bool,), "true or false")
    elif datatype == "BYTES":
        _check_types(what, datatype, flat, kinds, (str,), "strings")
    elif datatype in INTEGER_RANGES:
        _check_types(what, datatype, flat, kinds, (int,), "integers")
        low, high = INTEGER_RANGES[datatype]
        smallest, largest = min(flat), max(flat)
        if smallest < low or largest > high:
            bad = smallest if smallest < low else largest
            raise fail(what, f"JSON value {bad} is out of range for {datatype} [{low}, {high}]")
    else:
        _check_types(what, datatype, flat, kinds, (float, int), "numbers")
        if int in kinds:
            try:  # JSON integers are unbounded; one past float range cannot convert
                float(min(flat)), float(max(flat))
            except OverflowError:
                raise fail(what, f"a JSON value is out of range for {datatype}") from None
    return flat


_FLOAT_DATATYPES = frozenset({"FP32", "FP64"})   # FP16 and BF16 are binary only


def _check_types(what: str, datatype: str, flat: list[Any], kinds: set[type], types: tuple[type, ...],
                 wanted: str) -> None:
    # type() rather than isinstance: bool is an int subclass, and JSON true
    # must not pass as the number 1. ``kinds`` (the set of types) was built
    # in C; the element-by-element walk only runs to name the culprit.
    if kinds.issubset(types):
        return
    for index, value in enumerate(flat):
        if type(value) not in types:
            raise fail(
                what,
                f"{datatype} JSON data must be {wanted}, but element {index} is {_json_type(value)}",
            )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is bool:
        return "a boolean"
    if type(value) in (int, float):
        return f"the number {value!r}"
    if type(value) is str:
        return "a string"
    if type(value) is list:
        return "an array"
    if type(value) is dict:
        return "an object"
    return type(value).__name__
