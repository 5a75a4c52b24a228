"""Dtype tables and the KServe v2 / Triton names."""

from __future__ import annotations

import numpy as np
import pytest

from cartonstore.format.dtypes import (
    CARTON_DTYPES,
    SAFETENSORS_DTYPE_BITS,
    carton_dtype_to_v2,
    carton_numpy_dtype,
    is_numeric_carton_dtype,
    safetensors_dtype_to_v2,
    shape_to_v2_dims,
)


@pytest.mark.parametrize(
    ("dtype", "v2", "numpy_name"),
    [
        ("float32", "FP32", "<f4"),
        ("float64", "FP64", "<f8"),
        ("string", "BYTES", None),
        ("int8", "INT8", "|i1"),
        ("int16", "INT16", "<i2"),
        ("int32", "INT32", "<i4"),
        ("int64", "INT64", "<i8"),
        ("uint8", "UINT8", "|u1"),
        ("uint16", "UINT16", "<u2"),
        ("uint32", "UINT32", "<u4"),
        ("uint64", "UINT64", "<u8"),
    ],
)
def test_carton_dtypes(dtype: str, v2: str, numpy_name: str | None) -> None:
    assert CARTON_DTYPES[dtype] == numpy_name
    assert carton_dtype_to_v2(dtype) == v2
    assert is_numeric_carton_dtype(dtype) is (numpy_name is not None)
    if numpy_name is not None:
        assert carton_numpy_dtype(dtype) == np.dtype(numpy_name)
        assert carton_numpy_dtype(dtype).name == dtype


def test_carton_dtype_list_is_exactly_the_spec_list() -> None:
    assert set(CARTON_DTYPES) == {
        "float32", "float64", "string", "int8", "int16", "int32", "int64",
        "uint8", "uint16", "uint32", "uint64",
    }  # fmt: skip


@pytest.mark.parametrize("bad", ["float16", "nested", "FP32", ""])
def test_unknown_carton_dtypes_are_programming_errors(bad: str) -> None:
    with pytest.raises(ValueError, match="not a carton dtype"):
        carton_dtype_to_v2(bad)
    with pytest.raises(ValueError):
        carton_numpy_dtype(bad)
    assert not is_numeric_carton_dtype(bad)


@pytest.mark.parametrize(
    ("dtype", "v2", "bits"),
    [
        ("BOOL", "BOOL", 8),
        ("U8", "UINT8", 8),
        ("I8", "INT8", 8),
        ("I16", "INT16", 16),
        ("U16", "UINT16", 16),
        ("F16", "FP16", 16),
        ("BF16", "BF16", 16),
        ("I32", "INT32", 32),
        ("U32", "UINT32", 32),
        ("F32", "FP32", 32),
        ("F64", "FP64", 64),
        ("I64", "INT64", 64),
        ("U64", "UINT64", 64),
        # No KServe v2 name: the safetensors name is kept.
        ("F8_E5M2", "F8_E5M2", 8),
        ("F8_E4M3", "F8_E4M3", 8),
        ("F8_E8M0", "F8_E8M0", 8),
        ("F6_E2M3", "F6_E2M3", 6),
        ("F6_E3M2", "F6_E3M2", 6),
        ("F4", "F4", 4),
        ("C64", "C64", 64),
    ],
)
def test_safetensors_dtypes(dtype: str, v2: str, bits: int) -> None:
    assert safetensors_dtype_to_v2(dtype) == v2
    assert SAFETENSORS_DTYPE_BITS[dtype] == bits


def test_every_safetensors_dtype_has_a_v2_answer() -> None:
    assert all(safetensors_dtype_to_v2(d) for d in SAFETENSORS_DTYPE_BITS)
    with pytest.raises(ValueError, match="not a safetensors dtype"):
        safetensors_dtype_to_v2("F128")


@pytest.mark.parametrize(
    ("shape", "dims"),
    [
        (None, [-1]),
        ("*", [-1]),
        ("input_shape", [-1]),
        ((), []),
        ([], []),
        (("batch_size", 3, 512, 512), [-1, 3, 512, 512]),
        (("*", "*", "*"), [-1, -1, -1]),
        ((0, 1), [0, 1]),
        ([2, "n"], [2, -1]),
    ],
)
def test_shape_to_v2_dims(shape: object, dims: list[int]) -> None:
    assert shape_to_v2_dims(shape) == dims  # type: ignore[arg-type]  # shapes of every kind, on purpose
