"""Writing a carton's tensor_data/: index.toml and one data file per
tensor (numeric ones raw little-endian in C order as .bin, strings as a
.toml ``data`` list), as format/tensor_data.py reads them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from cartonstore.format.dtypes import CARTON_DTYPES, v2_to_carton_dtype
from cartonstore.v2.datatypes import datatype_of


def carton_dtype_of(array: np.ndarray) -> str:
    """The carton dtype that holds ``array`` (InvalidInput naming it when none does)."""
    return v2_to_carton_dtype(datatype_of(array))


def write_tensors(directory: Path, tensors: Mapping[str, np.ndarray]) -> None:
    import tomli_w

    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for index, (name, array) in enumerate(tensors.items()):
        dtype = carton_dtype_of(array)
        stem = f"tensor_{index}"   # tensor names may hold / or : (tf2onnx's "dense/BiasAdd:0"); index.toml keeps them
        if dtype == "string":
            file = f"{stem}.toml"
            data = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1).tolist()]
            (directory / file).write_text(tomli_w.dumps({"data": data}))
        else:
            file = f"{stem}.bin"
            (directory / file).write_bytes(np.ascontiguousarray(array, dtype=np.dtype(CARTON_DTYPES[dtype])).tobytes())
        entries.append({"name": name, "dtype": dtype, "shape": list(array.shape), "file": file})
    (directory / "index.toml").write_text(tomli_w.dumps({"tensor": entries}))
