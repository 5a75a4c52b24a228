"""The format parsers against a real carton written by Carton's own packer.

The fixture's entries are zstd-compressed (zip method 93), which Python's
zipfile cannot decode, so entries are read here from the central directory
and local headers and decoded with zstandard.
"""

from __future__ import annotations

import hashlib
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import zstandard
from conftest import FIXTURE_CARTON as FIXTURE
from conftest import FIXTURE_DIGEST as MANIFEST_SHA256

from cartonstore.format import (
    check_references,
    check_tensor_files,
    check_tensor_index_present,
    load_tensors,
    parse_carton_toml,
    parse_manifest,
    parse_tensor_index,
    shape_to_v2_dims,
    validate_carton_path,
)

_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
_ZSTD = 93


def read_entries(path: Path) -> dict[str, bytes]:
    """Every entry of a zip, decoded (stored, deflate or zstd)."""
    blob = path.read_bytes()
    entries = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            fields = _LOCAL_HEADER.unpack_from(blob, info.header_offset)
            name_len, extra_len = fields[-2], fields[-1]
            start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
            raw = blob[start : start + info.compress_size]
            entries[info.filename] = _decode(info.compress_type, raw)
    return entries


def _decode(method: int, raw: bytes) -> bytes:
    if method == zipfile.ZIP_STORED:
        return raw
    if method == zipfile.ZIP_DEFLATED:
        return zlib.decompress(raw, -15)
    assert method == _ZSTD, f"unexpected zip method {method}"
    return zstandard.ZstdDecompressor().decompressobj().decompress(raw)


@pytest.fixture(scope="module")
def entries() -> dict[str, bytes]:
    return read_entries(FIXTURE)


def test_manifest(entries: dict[str, bytes]) -> None:
    manifest = parse_manifest(entries["MANIFEST"])
    assert manifest.digest == MANIFEST_SHA256
    assert "carton.toml" in manifest.paths
    # No LINKS here: every listed file is in the zip, with the listed sha256.
    assert set(manifest.paths) == set(entries) - {"MANIFEST"}
    for path, sha256 in manifest.entries:
        assert validate_carton_path(path) == path
        assert hashlib.sha256(entries[path]).hexdigest() == sha256, path


def test_carton_toml(entries: dict[str, bytes]) -> None:
    config = parse_carton_toml(entries["carton.toml"])
    assert config.model_name == "Test Model"
    assert config.runner.runner_name == "python"
    assert config.runner.required_framework_version == "=3.11"
    assert config.runner.opts == {"entrypoint_fn": "get_model", "entrypoint_package": "main"}
    assert config.inputs is not None and [spec.name for spec in config.inputs] == list("abcdefg")
    shapes = [shape_to_v2_dims(spec.shape) for spec in config.inputs]
    assert shapes == [[-1], [-1], [-1], [-1], [], [-1, 3, 512, 512], [-1, -1, -1]]
    assert config.outputs is not None and config.outputs[0].dtype == "uint32"
    assert config.tensor_references() == {"_tensor_0", "_tensor_1", "_tensor_2", "_tensor_3"}
    assert config.misc_references() == {"misc/_example_misc_file_0"}


def test_tensor_data_and_references(entries: dict[str, bytes]) -> None:
    manifest = parse_manifest(entries["MANIFEST"])
    paths = set(manifest.paths)
    assert check_tensor_index_present(paths)
    index = parse_tensor_index(entries["tensor_data/index.toml"])
    check_tensor_files(index, paths, {path: len(data) for path, data in entries.items()})
    tensors = load_tensors(index, entries.__getitem__)
    assert np.array_equal(tensors["_tensor_1"], np.ones(5, dtype=np.float32))
    assert tensors["_tensor_0"].shape == (3,)
    assert tensors["_tensor_0"][0] == "Hello 💖 😂😍🎉👍 Unicode"
    assert tensors["_tensor_2"].dtype == np.uint32 and tensors["_tensor_2"].shape == (5,)
    assert tensors["_tensor_3"].shape == () and tensors["_tensor_3"].dtype == np.int64
    config = parse_carton_toml(entries["carton.toml"])
    check_references(config, paths, {entry.name for entry in index})
