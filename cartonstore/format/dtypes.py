"""Dtype tables: carton and safetensors dtype names, their sizes, and their
KServe v2 / Triton datatype names.

These are lookup tables, not parsers: the functions here take names that a
parser has already validated, and a name outside the tables is a programming
error (``ValueError``), not a bad carton; v2_to_carton_dtype alone takes a
caller's datatype, and says which it cannot name (``InvalidInput``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from cartonstore.errors import InvalidInput

if TYPE_CHECKING:
    import numpy as np

# Carton v1 dtype -> numpy dtype string (little-endian, as tensor_data .bin
# files are). "string" has no fixed-size numpy form: it lives in TOML files.
CARTON_DTYPES: dict[str, str | None] = {
    "float32": "<f4",
    "float64": "<f8",
    "string": None,
    "int8": "|i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "uint8": "|u1",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
}

# Carton v1 dtype <-> KServe v2 datatype: the one table both directions read.
CARTON_TO_V2: dict[str, str] = {
    "float32": "FP32",
    "float64": "FP64",
    "string": "BYTES",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
}
V2_TO_CARTON: dict[str, str] = {v2: name for name, v2 in CARTON_TO_V2.items()}

# safetensors dtype -> bits per element, as the reference implementation
# (huggingface/safetensors, Dtype::bitsize) defines them. Sub-byte types
# (F4, F6_*) make whole tensors that must still fill whole bytes.
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

# Only the safetensors dtypes that KServe v2 can name. The rest (F8_*, F6_*,
# F4, C64) have no v2 datatype; see safetensors_dtype_to_v2.
_SAFETENSORS_TO_V2: dict[str, str] = {
    "BOOL": "BOOL",
    "U8": "UINT8",
    "I8": "INT8",
    "I16": "INT16",
    "U16": "UINT16",
    "F16": "FP16",
    "BF16": "BF16",
    "I32": "INT32",
    "U32": "UINT32",
    "F32": "FP32",
    "F64": "FP64",
    "I64": "INT64",
    "U64": "UINT64",
}


def is_numeric_carton_dtype(dtype: str) -> bool:
    """True for carton dtypes stored as raw little-endian ``.bin`` data."""
    return CARTON_DTYPES.get(dtype) is not None


def carton_dtype_itemsize(dtype: str) -> int:
    """Bytes per element of a numeric carton dtype, read from its numpy
    typestr ("<f4": 4) without numpy.

    Raises ValueError for "string" and for names that are not carton dtypes.
    """
    np_name = CARTON_DTYPES.get(dtype)
    if np_name is None:
        raise ValueError(f"{dtype!r} is not a numeric carton dtype")
    return int(np_name[2:])


def carton_numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a numeric carton dtype (little-endian).

    Raises ValueError for "string" and for names that are not carton dtypes.
    """
    np_name = CARTON_DTYPES.get(dtype)
    if np_name is None:
        raise ValueError(f"{dtype!r} is not a numeric carton dtype")
    import numpy as np  # imported here: the tables serve parsing (path, ls, inspect), which never needs numpy

    return np.dtype(np_name)


def carton_dtype_to_v2(dtype: str) -> str:
    """The KServe v2 datatype of a carton dtype ("float32" -> "FP32").

    Raises ValueError for a name that is not a carton dtype.
    """
    try:
        return CARTON_TO_V2[dtype]
    except KeyError:
        raise ValueError(f"{dtype!r} is not a carton dtype") from None


def v2_to_carton_dtype(datatype: str) -> str:
    """The carton dtype of a KServe v2 datatype ("FP32" -> "float32"):
    InvalidInput for one carton has no name for (FP16, BF16, BOOL), since
    the datatype comes from a caller's tensor, not from a parsed carton."""
    try:
        return V2_TO_CARTON[datatype]
    except KeyError:
        raise InvalidInput(
            f"datatype {datatype!r} has no carton dtype (carton has {', '.join(sorted(V2_TO_CARTON))})",
            subject=datatype,
        ) from None


def safetensors_dtype_to_v2(dtype: str) -> str:
    """The KServe v2 datatype of a safetensors dtype ("F16" -> "FP16").

    KServe v2 has no name for FP8, FP6, FP4 or complex types; for those the
    safetensors name itself is returned ("F8_E4M3"), so metadata stays
    truthful rather than claiming a wider type. Raises ValueError for a name
    that is not a safetensors dtype.
    """
    if dtype not in SAFETENSORS_DTYPE_BITS:
        raise ValueError(f"{dtype!r} is not a safetensors dtype")
    return _SAFETENSORS_TO_V2.get(dtype, dtype)


def shape_to_v2_dims(shape: str | Sequence[int | str] | None) -> list[int]:
    """KServe v2 dims of a carton shape: symbolic and "*" dimensions are -1.

    A shape given as one string (a symbol for the whole shape, or "*") and a
    missing shape (None) both mean "any shape", which v2 can only say as
    ``[-1]``. A scalar ``[]`` stays ``[]``.
    """
    if shape is None or isinstance(shape, str):
        return [-1]
    return [dim if isinstance(dim, int) else -1 for dim in shape]


def tensor_metadata(specs: Iterable[Any] | None) -> list[dict[str, Any]]:  # TensorSpec-like: name, dtype, shape
    """KServe v2 model metadata for carton.toml's tensors (inputs or outputs; None: [])."""
    return [{"name": s.name, "datatype": carton_dtype_to_v2(s.dtype), "shape": shape_to_v2_dims(s.shape)}
            for s in specs or ()]


# TensorProto.DataType (onnx.proto) -> the name onnxruntime's type names use ("tensor(float16)")
ONNX_ELEM_TYPE_NAMES = {
    0: "undefined", 1: "float", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "string", 9: "bool", 10: "float16", 11: "double", 12: "uint32", 13: "uint64", 14: "complex64",
    15: "complex128", 16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2",
    20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1", 24: "float8e8m0", 25: "uint2", 26: "int2",
    27: "float6e2m3", 28: "float6e3m2",
}

# ONNX tensor element types, as onnxruntime names them -> carton dtypes
ONNX_TO_CARTON = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(string)": "string",
    "tensor(int8)": "int8", "tensor(int16)": "int16", "tensor(int32)": "int32", "tensor(int64)": "int64",
    "tensor(uint8)": "uint8", "tensor(uint16)": "uint16", "tensor(uint32)": "uint32", "tensor(uint64)": "uint64",
}


def onnx_kind_text(onnx_type: str) -> str:
    """What an ONNX value that is not a carton tensor is, and what to do ("a
    sequence of maps (seq(map(...))): cartonstore serves tensors; ...")."""
    if onnx_type.startswith("seq(map("):
        kind = "a sequence of maps"
    elif onnx_type.startswith("seq("):
        kind = "a sequence"
    elif onnx_type.startswith("map("):
        kind = "a map"
    else:
        kind = "a tensor type carton has no dtype for"
    hint = ("; convert with zipmap disabled (skl2onnx: options={'zipmap': False})"
            if kind == "a sequence of maps" else "")
    return f"{kind} ({onnx_type}): cartonstore serves tensors{hint}"
