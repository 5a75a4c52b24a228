"""Tensors between the wire and numpy: decoding a parsed tensor into an
array, and encoding an array as binary tensor data or JSON "data".

Binary numeric data is never copied on the way in (np.frombuffer over the
body) and contiguous little-endian arrays are not copied on the way out
(a memoryview of the array's own buffer).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .datatypes import BINARY_ONLY_DATATYPES, check_datatype, datatype_of, numpy_dtype
from .elements import check_json_data, check_numeric_size, fail, split_bytes_framing
from .wire_types import WireTensor


def tensor_to_numpy(t: WireTensor) -> np.ndarray:
    """The tensor as a numpy array of its shape. Binary numeric data is not
    copied (the array is a read-only view of the body); BYTES become an object
    array of bytes."""
    datatype = t.datatype
    shape = t.shape
    if t.data is None:
        flat = check_json_data(t.what, datatype, shape, t.json_data, numbers_only=t.json_numbers)
        if datatype == "BYTES":
            return _object_array([s.encode("utf-8") for s in flat], shape)
        return np.array(flat, dtype=numpy_dtype(datatype)).reshape(shape)
    if datatype == "BYTES":
        return _object_array(split_bytes_framing(t.what, shape, t.data), shape)
    check_numeric_size(t.what, datatype, shape, len(t.data))
    if datatype == "BOOL" and len(t.data) and np.frombuffer(t.data, dtype=np.uint8).max() > 1:
        raise fail(t.what, "BOOL binary data must be bytes 0 or 1")
    return np.frombuffer(t.data, dtype=numpy_dtype(datatype)).reshape(shape)


def _object_array(elements: list[bytes], shape: list[int]) -> np.ndarray:
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array.reshape(shape)


def numpy_to_binary(a: np.ndarray, datatype: str | None = None) -> bytes | memoryview:
    """The binary wire form of ``a``: little-endian, row-major; BYTES as <u4
    length + bytes per element. Contiguous little-endian arrays are not copied."""
    return to_binary("tensor", np.asarray(a), datatype)


def to_binary(what: str, a: np.ndarray, datatype: str | None) -> bytes | memoryview:
    datatype = datatype_of(a) if datatype is None else check_datatype(datatype, what)
    if datatype == "BYTES":
        return frame_bytes(what, a.reshape(-1).tolist())
    target = numpy_dtype(datatype)
    if a.dtype != target:
        if a.dtype.kind in "OSU" or not np.can_cast(a.dtype, target, casting="same_kind"):
            raise fail(what, f"numpy dtype {a.dtype} cannot be sent as {datatype}")
        a = a.astype(target)
    a = np.ascontiguousarray(a).reshape(-1)
    return a.view(np.uint8).data


def frame_bytes(what: str, elements: list[Any]) -> bytes:
    """BYTES elements (bytes or str) as binary tensor data: each a <u4
    length, then its bytes."""
    parts: list[bytes] = []
    for index, element in enumerate(elements):
        if isinstance(element, str):
            element = element.encode("utf-8")
        elif not isinstance(element, bytes):
            raise fail(what, f"BYTES element {index} is {type(element).__name__}, not bytes or str")
        if len(element) >= 2**32:
            raise fail(what, f"BYTES element {index} is too large ({len(element)} bytes)")
        parts.append(len(element).to_bytes(4, "little"))
        parts.append(element)
    return b"".join(parts)


def numpy_to_json_data(a: np.ndarray, datatype: str | None = None) -> list[Any]:
    """The JSON "data" of ``a``: a flat row-major list; BYTES as strings."""
    return to_json("tensor", np.asarray(a), datatype)


def to_json(what: str, a: np.ndarray, datatype: str | None) -> list[Any]:
    value = json_value(what, a, datatype)
    return value.tolist() if isinstance(value, np.ndarray) else value


def json_value(what: str, a: np.ndarray, datatype: str | None) -> np.ndarray | list[str]:
    """What json_codec.dumps writes as the JSON "data" of ``a``: numbers as a
    flat, contiguous array of the datatype's own dtype (written without
    becoming a million Python objects first), BYTES as a list of strings."""
    datatype = datatype_of(a) if datatype is None else check_datatype(datatype, what)
    if datatype in BINARY_ONLY_DATATYPES:
        raise fail(what, f"{datatype} data cannot be sent as JSON (binary only)")
    if datatype != "BYTES":
        return np.ascontiguousarray(a, dtype=numpy_dtype(datatype).newbyteorder("=")).reshape(-1)
    strings: list[str] = []
    for index, element in enumerate(a.reshape(-1).tolist()):
        if isinstance(element, bytes):
            try:
                element = element.decode("utf-8")
            except UnicodeDecodeError:
                raise fail(
                    what, f"BYTES element {index} is not valid UTF-8, so it can only be sent binary"
                ) from None
        elif not isinstance(element, str):
            raise fail(what, f"BYTES element {index} is {type(element).__name__}, not bytes or str")
        strings.append(element)
    return strings
