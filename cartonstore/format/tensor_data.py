"""tensor_data/: the index of test and example tensors, and their data files.

index.toml lists ``[[tensor]]`` entries. Numeric tensors live in ``.bin``
files (little-endian, C order), string tensors in ``.toml`` files
(``data = [...]``), and nested tensors are lists of other, non-nested,
entries. Carton writes ``inner = []`` on every non-nested entry and omits
``shape`` and ``file`` on nested ones; both forms are accepted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cartonstore.errors import InvalidCarton

from ._toml import TomlTable, is_int, load_toml, type_name
from .dtypes import (
    CARTON_DTYPES,
    carton_dtype_itemsize,
    carton_numpy_dtype,
    is_numeric_carton_dtype,
)
from .paths import validate_carton_path

if TYPE_CHECKING:
    import numpy as np

TENSOR_DIR = "tensor_data/"
INDEX = "tensor_data/index.toml"
NESTED = "nested"


@dataclass(frozen=True)
class TensorEntry:
    """One [[tensor]] of index.toml.

    Non-nested entries have ``shape`` and ``file`` (relative to tensor_data/)
    and ``inner`` None; nested entries have ``inner`` and neither of the others.
    """

    name: str
    dtype: str
    shape: tuple[int, ...] | None
    file: str | None
    inner: tuple[str, ...] | None

    @property
    def path(self) -> str | None:
        """The data file's carton path ("tensor_data/tensor_0.bin")."""
        return None if self.file is None else TENSOR_DIR + self.file


def parse_tensor_index(raw: bytes) -> tuple[TensorEntry, ...]:
    """Parse and validate tensor_data/index.toml.

    Checks: names are unique and non-empty; dtype is a carton dtype or
    "nested"; numeric tensors name a ``.bin`` file and string tensors a
    ``.toml`` file, a safe relative path under tensor_data/; shapes are lists
    of non-negative integers; nested tensors list existing, non-nested inner
    tensors, each inner tensor belonging to one nested tensor at most (Carton
    moves it out of the top level when it loads it).

    Raises InvalidCarton("tensor_data/index.toml", ..., field="tensor[2].file").
    """
    top = TomlTable(load_toml(raw, INDEX), INDEX)
    tables = top.opt_tables("tensor") or []
    entries = tuple(_entry(table) for table in tables)
    _check_names(tables, entries)
    _check_nesting(tables, entries)
    return entries


def _entry(table: TomlTable) -> TensorEntry:
    name = table.req_str("name", non_empty=True)
    dtype = table.req_str("dtype")
    if dtype == NESTED:
        return _nested_entry(table, name)
    if dtype not in CARTON_DTYPES:
        raise table.error("dtype", f"{dtype!r} is not a carton dtype or 'nested'")
    inner = table.opt_str_list("inner")
    if inner:
        problem = f"only nested tensors have inner tensors, and {name!r} is {dtype}"
        raise table.error("inner", problem)
    return TensorEntry(name, dtype, _shape(table), _file(table, dtype), None)


def _nested_entry(table: TomlTable, name: str) -> TensorEntry:
    for key in ("file", "shape"):
        if key in table.data:
            raise table.error(key, f"nested tensor {name!r} must not have a {key}")
    inner = table.opt_str_list("inner")
    if inner is None:
        raise table.error("inner", f"nested tensor {name!r} must list its inner tensors")
    return TensorEntry(name, NESTED, None, None, tuple(inner))


def _shape(table: TomlTable) -> tuple[int, ...]:
    shape = table.require("shape")
    if not isinstance(shape, list):
        raise table.error("shape", f"must be a list of integers, not {type_name(shape)}")
    for i, dim in enumerate(shape):
        if not is_int(dim) or dim < 0:
            what = dim if is_int(dim) else type_name(dim)
            where = f"{table.field('shape')}[{i}]"
            raise InvalidCarton(INDEX, f"must be a non-negative integer, not {what}", field=where)
    return tuple(shape)


def _file(table: TomlTable, dtype: str) -> str:
    file = table.req_str("file")
    validate_carton_path(file, file_for_errors=INDEX, field=table.field("file"))
    suffix = ".bin" if is_numeric_carton_dtype(dtype) else ".toml"
    if not file.endswith(suffix) or file == "index.toml":
        raise table.error("file", f"a {dtype} tensor is stored in a '{suffix}' file, not {file!r}")
    return file


def _check_names(tables: list[TomlTable], entries: tuple[TensorEntry, ...]) -> None:
    seen: set[str] = set()
    for table, entry in zip(tables, entries, strict=True):
        if entry.name in seen:
            raise table.error("name", f"{entry.name!r} is defined twice")
        seen.add(entry.name)


def _check_nesting(tables: list[TomlTable], entries: tuple[TensorEntry, ...]) -> None:
    by_name = {entry.name: entry for entry in entries}
    owner: dict[str, str] = {}
    for table, entry in zip(tables, entries, strict=True):
        for i, inner in enumerate(entry.inner or ()):
            where = f"{table.field('inner')}[{i}]"
            target = by_name.get(inner)
            if target is None:
                raise InvalidCarton(INDEX, f"inner tensor {inner!r} is not defined", field=where)
            if target.dtype == NESTED:
                raise InvalidCarton(INDEX, f"inner tensor {inner!r} is itself nested", field=where)
            if inner in owner:
                problem = f"inner tensor {inner!r} already belongs to {owner[inner]!r}"
                raise InvalidCarton(INDEX, problem, field=where)
            owner[inner] = entry.name


def expected_bin_size(entry: TensorEntry) -> int:
    """Bytes of a numeric entry's .bin file: product of the shape times the item size.

    Raises ValueError for string and nested entries, which have no fixed size.
    """
    if entry.shape is None or not is_numeric_carton_dtype(entry.dtype):
        raise ValueError(f"tensor {entry.name!r} ({entry.dtype}) has no fixed binary size")
    return math.prod(entry.shape) * carton_dtype_itemsize(entry.dtype)


def check_tensor_index_present(manifest_paths: Collection[str]) -> bool:
    """Whether the MANIFEST lists tensor_data/index.toml.

    Raises InvalidCarton when tensor_data/ holds other files but no index
    (the spec requires the index then).
    """
    if INDEX in manifest_paths:
        return True
    for path in manifest_paths:
        if path.startswith(TENSOR_DIR):
            raise InvalidCarton(INDEX, f"is missing, but the carton has {path}")
    return False


def check_tensor_files(
    entries: Sequence[TensorEntry],
    manifest_paths: Collection[str],
    sizes: Mapping[str, int] | None = None,
) -> None:
    """Check the data files the index names against the MANIFEST and their sizes.

    Every file must be listed in the MANIFEST. When ``sizes`` (carton path ->
    byte size) is given, each ``.bin`` file whose size it holds must match
    shape and dtype; files missing from ``sizes`` (e.g. not downloaded yet)
    are skipped. Files in tensor_data/ that no entry names are allowed:
    Carton reads only what the index names, so they are harmless.

    Raises InvalidCarton naming the index (missing file) or the data file
    (wrong size, with the tensor, expected and actual sizes).
    """
    for entry in entries:
        path = entry.path
        if path is None:
            continue
        if path not in manifest_paths:
            raise InvalidCarton(
                INDEX,
                f"names {entry.file!r}, but the MANIFEST does not list {path}",
                field=f"tensor {entry.name!r}.file",
            )
        if sizes is not None and path in sizes and is_numeric_carton_dtype(entry.dtype):
            _check_size(entry, path, sizes[path])


def _check_size(entry: TensorEntry, path: str, actual: int) -> None:
    expected = expected_bin_size(entry)
    if actual != expected:
        raise InvalidCarton(
            path,
            f"tensor {entry.name!r} ({entry.dtype}, shape {list(entry.shape or ())}) "
            f"needs {expected} bytes, but the file has {actual}",
        )


def decode_numeric(entry: TensorEntry, data: bytes) -> np.ndarray:
    """The array stored in a numeric entry's .bin bytes (a writable, native-order copy).

    Raises InvalidCarton(tensor_data/<file>, ...) when the size does not match.
    """
    if entry.path is None or not is_numeric_carton_dtype(entry.dtype):
        raise ValueError(f"tensor {entry.name!r} ({entry.dtype}) is not numeric")
    _check_size(entry, entry.path, len(data))
    import numpy as np  # imported here: checking a carton (add, inspect) never decodes numeric data

    dtype = carton_numpy_dtype(entry.dtype)
    flat = np.frombuffer(data, dtype=dtype)
    try:
        shaped = flat.reshape(entry.shape)
    except ValueError as e:  # dims too large for numpy, even with no elements
        problem = f"tensor {entry.name!r} has an unusable shape: {e}"
        raise InvalidCarton(entry.path, problem) from None
    # astype copies: the result owns writable memory in the host's byte order.
    return shaped.astype(dtype.newbyteorder("="))


def decode_string(entry: TensorEntry, raw_toml: bytes) -> np.ndarray:
    """The object array of str stored in a string entry's .toml file (``data = [...]``).

    Raises InvalidCarton(tensor_data/<file>, ...) as string_data does.
    """
    strings = string_data(entry, raw_toml)
    import numpy as np  # imported here: checking a carton (add, inspect) needs only string_data

    array = np.empty(len(strings), dtype=object)
    array[:] = strings  # element-wise, so numpy never reinterprets the strings
    return array.reshape(entry.shape)


def string_data(entry: TensorEntry, raw_toml: bytes) -> list[str]:
    """The strings of a string entry's .toml file (``data = [...]``), flat.

    Raises InvalidCarton(tensor_data/<file>, ...) when the file is not TOML,
    ``data`` is not a list of strings, or its length does not match the shape.
    """
    if entry.path is None or entry.shape is None or entry.dtype != "string":
        raise ValueError(f"tensor {entry.name!r} ({entry.dtype}) is not a string tensor")
    strings = TomlTable(load_toml(raw_toml, entry.path), entry.path).opt_str_list("data")
    if strings is None:
        raise InvalidCarton(entry.path, "is required but missing", field="data")
    expected = math.prod(entry.shape)
    if len(strings) != expected:
        raise InvalidCarton(
            entry.path,
            f"tensor {entry.name!r} (shape {list(entry.shape)}) needs {expected} strings, "
            f"but the file has {len(strings)}",
            field="data",
        )
    return strings


def load_tensors(
    entries: Sequence[TensorEntry], read: Callable[[str], bytes]
) -> dict[str, np.ndarray | list[np.ndarray]]:
    """Decode every entry, reading data files with ``read(carton_path)``.

    Nested entries become lists of their inner arrays; inner tensors also
    stay available under their own names. Raises InvalidCarton for bad data;
    whatever ``read`` raises propagates unchanged.
    """
    flat: dict[str, np.ndarray] = {}
    for entry in entries:
        if entry.path is None:
            continue
        data = read(entry.path)
        if entry.dtype == "string":
            flat[entry.name] = decode_string(entry, data)
        else:
            flat[entry.name] = decode_numeric(entry, data)
    out: dict[str, np.ndarray | list[np.ndarray]] = dict(flat)
    for entry in entries:
        if entry.inner is not None:
            out[entry.name] = [flat[name] for name in entry.inner]
    return out
