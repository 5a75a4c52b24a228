"""tensor_data/index.toml and tensor data files."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import tomli_w

from cartonstore.errors import InvalidCarton
from cartonstore.format.tensor_data import (
    TensorEntry,
    check_tensor_files,
    check_tensor_index_present,
    decode_numeric,
    decode_string,
    expected_bin_size,
    load_tensors,
    parse_tensor_index,
)

INDEX: dict[str, Any] = {
    "tensor": [
        {"name": "f", "dtype": "float32", "shape": [2, 3], "file": "tensor_0.bin", "inner": []},
        {"name": "s", "dtype": "string", "shape": [3], "file": "tensor_1.toml", "inner": []},
        {"name": "scalar", "dtype": "int64", "shape": [], "file": "sub/tensor_2.bin"},
        {"name": "u", "dtype": "uint16", "shape": [0, 4], "file": "tensor_3.bin"},
        {"name": "nest", "dtype": "nested", "inner": ["f", "u"]},
    ]
}

F = np.arange(6, dtype="<f4").reshape(2, 3)
FILES = {
    "tensor_data/tensor_0.bin": F.tobytes(),
    "tensor_data/tensor_1.toml": 'data = ["a", "b 💖", "c"]\n'.encode(),
    "tensor_data/sub/tensor_2.bin": np.array(-5, dtype="<i8").tobytes(),
    "tensor_data/tensor_3.bin": b"",
}
MANIFEST_PATHS = {"carton.toml", "tensor_data/index.toml", *FILES}


def dump(data: dict[str, Any]) -> bytes:
    return tomli_w.dumps(data).encode()


def entries() -> tuple[TensorEntry, ...]:
    return parse_tensor_index(dump(INDEX))


def test_parses_entries() -> None:
    parsed = entries()
    assert parsed[0] == TensorEntry("f", "float32", (2, 3), "tensor_0.bin", None)
    assert parsed[0].path == "tensor_data/tensor_0.bin"
    assert parsed[2] == TensorEntry("scalar", "int64", (), "sub/tensor_2.bin", None)
    assert parsed[4] == TensorEntry("nest", "nested", None, None, ("f", "u"))
    assert parsed[4].path is None


def test_empty_index() -> None:
    assert parse_tensor_index(b"") == ()
    assert parse_tensor_index(b"tensor = []\n") == ()


def test_expected_bin_size() -> None:
    parsed = entries()
    assert [expected_bin_size(e) for e in (parsed[0], parsed[2], parsed[3])] == [24, 8, 0]
    with pytest.raises(ValueError):
        expected_bin_size(parsed[1])


def test_load_tensors() -> None:
    tensors = load_tensors(entries(), FILES.__getitem__)
    assert np.array_equal(tensors["f"], F) and tensors["f"].dtype == np.float32
    assert tensors["f"].flags.writeable
    tensors["f"][0, 0] = 42  # a copy, not a view of the bytes
    assert tensors["s"].dtype == object and tensors["s"].tolist() == ["a", "b 💖", "c"]
    assert tensors["scalar"].shape == () and int(tensors["scalar"]) == -5
    assert tensors["u"].shape == (0, 4) and tensors["u"].dtype == np.uint16
    nest = tensors["nest"]
    assert isinstance(nest, list) and len(nest) == 2
    assert nest[0] is tensors["f"] and nest[1] is tensors["u"]


def test_load_tensors_reads_each_file_once_and_lets_read_errors_through() -> None:
    reads: list[str] = []

    def read(path: str) -> bytes:
        reads.append(path)
        return FILES[path]

    load_tensors(entries(), read)
    assert sorted(reads) == sorted(FILES)
    with pytest.raises(KeyError):
        load_tensors(entries(), {}.__getitem__)


def _set_tensor(index: int, key: str, value: Any) -> bytes:
    data = copy.deepcopy(INDEX)
    if value is DELETE:
        del data["tensor"][index][key]
    else:
        data["tensor"][index][key] = value
    return dump(data)


DELETE = object()

BAD = [
    (dump({"tensor": {"name": "x"}}), "tensor", "must be an array"),
    (dump({"tensor": [1]}), "tensor[0]", "must be a table"),
    (_set_tensor(1, "name", "f"), "tensor[1].name", "'f' is defined twice"),
    (_set_tensor(0, "name", DELETE), "tensor[0].name", "is required but missing"),
    (_set_tensor(0, "name", ""), "tensor[0].name", "must not be empty"),
    (_set_tensor(0, "dtype", "float16"), "tensor[0].dtype", "not a carton dtype or 'nested'"),
    (_set_tensor(0, "dtype", 3), "tensor[0].dtype", "must be a string"),
    (_set_tensor(0, "file", "tensor_0.toml"), "tensor[0].file", "stored in a '.bin' file"),
    (_set_tensor(1, "file", "tensor_1.bin"), "tensor[1].file", "stored in a '.toml' file"),
    (_set_tensor(1, "file", "index.toml"), "tensor[1].file", "stored in a '.toml' file"),
    (_set_tensor(0, "file", DELETE), "tensor[0].file", "is required but missing"),
    (_set_tensor(0, "file", "../model/x.bin"), "tensor[0].file", "'..' component"),
    (_set_tensor(0, "file", "/abs.bin"), "tensor[0].file", "is absolute"),
    (_set_tensor(0, "file", "a\\b.bin"), "tensor[0].file", "backslash"),
    (_set_tensor(0, "shape", DELETE), "tensor[0].shape", "is required but missing"),
    (_set_tensor(0, "shape", "*"), "tensor[0].shape", "must be a list of integers, not a string"),
    (_set_tensor(0, "shape", [2, -3]), "tensor[0].shape[1]", "non-negative integer, not -3"),
    (_set_tensor(0, "shape", [2, "n"]), "tensor[0].shape[1]", "not a string"),
    (_set_tensor(0, "shape", [True]), "tensor[0].shape[0]", "not a boolean"),
    (b"[[tensor]]\nshape = [1" + b"0" * 19 + b"]\n", "tensor[0].shape[0]", "does not fit in 64 bits"),
    (_set_tensor(0, "inner", ["u"]), "tensor[0].inner", "only nested tensors have inner tensors"),
    (_set_tensor(4, "inner", DELETE), "tensor[4].inner", "must list its inner tensors"),
    (_set_tensor(4, "inner", "f"), "tensor[4].inner", "must be an array"),
    (_set_tensor(4, "inner", ["f", 1]), "tensor[4].inner[1]", "must be a string"),
    (_set_tensor(4, "inner", ["missing"]), "tensor[4].inner[0]", "'missing' is not defined"),
    (_set_tensor(4, "inner", ["nest"]), "tensor[4].inner[0]", "'nest' is itself nested"),
    (_set_tensor(4, "inner", ["f", "f"]), "tensor[4].inner[1]", "already belongs to 'nest'"),
    (_set_tensor(4, "file", "x.bin"), "tensor[4].file", "must not have a file"),
    (_set_tensor(4, "shape", [1]), "tensor[4].shape", "must not have a shape"),
    (b"[[tensor]\n", "line 1", "not valid TOML"),
]


@pytest.mark.parametrize(("raw", "field", "problem"), BAD)
def test_rejects_bad_index(raw: bytes, field: str, problem: str) -> None:
    with pytest.raises(InvalidCarton, match=problem) as info:
        parse_tensor_index(raw)
    assert info.value.file == "tensor_data/index.toml"
    assert info.value.field == field


def test_check_tensor_files_passes_and_allows_unreferenced_files() -> None:
    sizes = {path: len(data) for path, data in FILES.items()}
    check_tensor_files(entries(), MANIFEST_PATHS | {"tensor_data/extra.bin"}, sizes)
    check_tensor_files(entries(), MANIFEST_PATHS)  # sizes unknown
    check_tensor_files(entries(), MANIFEST_PATHS, {})  # linked files not present yet


def test_check_tensor_files_missing_file() -> None:
    with pytest.raises(InvalidCarton, match="MANIFEST does not list tensor_data/sub/tensor_2.bin") as info:
        check_tensor_files(entries(), MANIFEST_PATHS - {"tensor_data/sub/tensor_2.bin"})
    assert info.value.file == "tensor_data/index.toml"
    assert info.value.field == "tensor 'scalar'.file"


def test_check_tensor_files_size_mismatch_names_tensor_and_sizes() -> None:
    sizes = {path: len(data) for path, data in FILES.items()}
    sizes["tensor_data/tensor_0.bin"] = 20
    with pytest.raises(InvalidCarton, match=r"tensor 'f' \(float32, shape \[2, 3\]\) needs 24 bytes, but the file has 20") as info:
        check_tensor_files(entries(), MANIFEST_PATHS, sizes)
    assert info.value.file == "tensor_data/tensor_0.bin"


def test_check_tensor_index_present() -> None:
    assert check_tensor_index_present(MANIFEST_PATHS)
    assert not check_tensor_index_present({"carton.toml", "model/x"})
    with pytest.raises(InvalidCarton, match="is missing, but the carton has tensor_data/t.bin") as info:
        check_tensor_index_present({"carton.toml", "tensor_data/t.bin"})
    assert info.value.file == "tensor_data/index.toml"


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"])
def test_decode_numeric_every_dtype_little_endian(dtype: str) -> None:
    values = np.arange(6).astype(dtype).reshape(3, 2)
    data = values.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    entry = TensorEntry("t", dtype, (3, 2), "t.bin", None)
    decoded = decode_numeric(entry, data)
    assert np.array_equal(decoded, values) and decoded.dtype == np.dtype(dtype)
    assert decoded.dtype.isnative


def test_decode_numeric_wrong_size() -> None:
    entry = TensorEntry("t", "float64", (2,), "t.bin", None)
    with pytest.raises(InvalidCarton, match="needs 16 bytes, but the file has 15") as info:
        decode_numeric(entry, b"\0" * 15)
    assert info.value.file == "tensor_data/t.bin"


def test_decode_numeric_huge_empty_shape() -> None:
    entry = TensorEntry("t", "uint8", (0, 2**62, 2**62), "t.bin", None)
    with pytest.raises(InvalidCarton, match="unusable shape"):
        decode_numeric(entry, b"")


@pytest.mark.parametrize(
    ("raw", "field", "problem"),
    [
        (b'data = ["a", "b"]\n', "data", r"needs 3 strings, but the file has 2"),
        (b'data = ["a", "b", 3]\n', "data[2]", "must be a string"),
        (b"data = 3\n", "data", "must be an array"),
        (b"other = 1\n", "data", "is required but missing"),
        (b"data = [\n", "line 2", "not valid TOML"),
        (b'data = ["\xff"]\n', "line 1", "not valid UTF-8"),
    ],
)
def test_decode_string_rejects(raw: bytes, field: str, problem: str) -> None:
    entry = TensorEntry("s", "string", (3,), "s.toml", None)
    with pytest.raises(InvalidCarton, match=problem) as info:
        decode_string(entry, raw)
    assert info.value.file == "tensor_data/s.toml"
    assert info.value.field == field


def test_decode_string_shapes() -> None:
    entry = TensorEntry("s", "string", (2, 2), "s.toml", None)
    array = decode_string(entry, b'data = ["a", "b", "c", "d"]\n')
    assert array.shape == (2, 2) and array[1, 0] == "c"
    scalar = decode_string(TensorEntry("s", "string", (), "s.toml", None), b'data = ["only"]\n')
    assert scalar.shape == () and scalar[()] == "only"


def test_decode_rejects_the_wrong_kind_of_entry() -> None:
    with pytest.raises(ValueError):
        decode_numeric(TensorEntry("s", "string", (1,), "s.toml", None), b"")
    with pytest.raises(ValueError):
        decode_string(TensorEntry("f", "float32", (1,), "f.bin", None), b"")
