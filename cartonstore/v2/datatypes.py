"""The KServe v2 datatype table: names, element sizes, numpy dtypes. Carton
dtypes map to and from these in format/dtypes.py."""

from __future__ import annotations

import numpy as np

from cartonstore.errors import InvalidInput

# v2 datatype -> bytes per element on the wire; None for BYTES, whose
# elements are length-prefixed and so have no fixed size.
ELEMENT_SIZES: dict[str, int | None] = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "FP32": 4,
    "FP64": 8,
    "BF16": 2,
    "BYTES": None,
}

# Wire order is little-endian whatever the host is, so the dtypes say so.
_NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("|u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("|i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}

_KIND_SIZE_TO_V2: dict[tuple[str, int], str] = {
    ("b", 1): "BOOL",
    ("u", 1): "UINT8",
    ("u", 2): "UINT16",
    ("u", 4): "UINT32",
    ("u", 8): "UINT64",
    ("i", 1): "INT8",
    ("i", 2): "INT16",
    ("i", 4): "INT32",
    ("i", 8): "INT64",
    ("f", 2): "FP16",
    ("f", 4): "FP32",
    ("f", 8): "FP64",
}

INTEGER_DATATYPES = frozenset(
    ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64")
)
FLOAT_DATATYPES = frozenset(("FP16", "FP32", "FP64", "BF16"))
# Datatypes that JSON cannot carry faithfully: Triton refuses them as JSON.
BINARY_ONLY_DATATYPES = frozenset(("FP16", "BF16"))


def is_datatype(name: object) -> bool:
    return isinstance(name, str) and name in ELEMENT_SIZES


def check_datatype(name: object, what: str) -> str:
    """``name`` if it is a v2 datatype, else InvalidInput about ``what``."""
    if isinstance(name, str) and name in ELEMENT_SIZES:
        return name
    raise InvalidInput(
        f"{what}: unknown datatype {name!r} (expected one of {', '.join(ELEMENT_SIZES)})",
        subject=what,
    )


def element_size(datatype: str) -> int | None:
    """Bytes per element on the wire; None for BYTES."""
    try:
        return ELEMENT_SIZES[datatype]
    except KeyError:
        raise InvalidInput(f"unknown datatype {datatype!r}", subject=datatype) from None


def _bfloat16() -> np.dtype:
    try:
        import ml_dtypes
    except ImportError:
        raise InvalidInput(
            "datatype BF16 needs the ml_dtypes package, which is not installed", subject="BF16"
        ) from None
    return np.dtype(ml_dtypes.bfloat16)  # type: ignore[no-any-return]  # ml_dtypes has no types


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype a v2 tensor decodes to (BYTES -> object of bytes)."""
    found = _NUMPY_DTYPES.get(datatype)
    if found is not None:
        return found
    if datatype == "BF16":
        return _bfloat16()
    raise InvalidInput(f"unknown datatype {datatype!r}", subject=datatype)


def datatype_of(array: np.ndarray) -> str:
    """The v2 datatype that carries ``array`` (str/bytes/object -> BYTES)."""
    dtype = array.dtype
    if dtype.kind in "OSU":
        return "BYTES"
    if dtype.name == "bfloat16":
        return "BF16"
    found = _KIND_SIZE_TO_V2.get((dtype.kind, dtype.itemsize))
    if found is None:
        raise InvalidInput(f"numpy dtype {dtype} has no KServe v2 datatype", subject=str(dtype))
    return found
