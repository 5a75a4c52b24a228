"""A carton of model files as other tools keep them (from_files.py): the
files under model/, carton.toml naming their format, refused paths."""

from __future__ import annotations

import hashlib

import pytest

from cartonstore.carton.checks import check_carton
from cartonstore.carton.from_files import ListedFile, files_carton, format_of_files
from cartonstore.errors import InvalidCarton
from cartonstore.format.carton_toml import parse_carton_toml


def _file(data: bytes) -> ListedFile:
    return ListedFile(hashlib.sha256(data).hexdigest(), len(data))


def test_the_weights_name_the_format_not_the_tokenizer_beside_them() -> None:
    assert format_of_files({"model.safetensors": 1 << 30, "tokenizer.json": 2 << 20, "x.gguf": 10}) == "safetensors"
    assert format_of_files({"llama-q4.GGUF": 5 << 30, "README.md": 300}) == "gguf"
    assert format_of_files({"tokenizer.json": 10, "vocab.txt": 5, "Makefile": 1}) == "files"
    assert format_of_files({"pytorch_model.bin": 100, "model.onnx": 50}) == "pytorch"


def test_a_repository_becomes_a_checked_carton_that_runs_no_runner() -> None:
    files = {"config.json": _file(b"{}"), "model.safetensors": _file(b"w" * 100), "sub/tokenizer.json": _file(b"t")}
    carton = files_carton("org/name", files, origin="hf://org/name", description="a test")
    assert sorted(carton.files) == ["carton.toml", "model/config.json", "model/model.safetensors",
                                    "model/sub/tokenizer.json"]
    config = parse_carton_toml(carton.small["carton.toml"])
    assert (config.model_name, config.runner.runner_name) == ("org/name", "safetensors")
    checked = check_carton(carton.view("hf://org/name"), links_raw=b"")
    assert checked.manifest.as_dict()["model/model.safetensors"] == files["model.safetensors"].digest
    assert checked.manifest.as_dict()["carton.toml"] == hashlib.sha256(carton.small["carton.toml"]).hexdigest()


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", "a//b", "a\\b", ""])
def test_a_path_that_escapes_or_is_not_a_path_is_refused_by_name(path: str) -> None:
    with pytest.raises(InvalidCarton, match="not an allowed file path") as caught:
        files_carton("m", {path: _file(b"x")}, origin="oci://r/m:1 layer 2")
    assert "oci://r/m:1 layer 2" in str(caught.value)


def test_no_files_is_refused() -> None:
    with pytest.raises(InvalidCarton, match="holds no files"):
        files_carton("m", {}, origin="hf://o/m")


@pytest.mark.parametrize(("files", "fmt"), [({"model.onnx": 10}, None), ({"w.bin": 10}, "onnx"),
                                            ({"main.py": 10}, "python"), ({"m.safetensors": 1}, "torchscript")])
def test_a_runner_is_never_named_by_a_source_or_an_unread_graph(files: dict[str, int], fmt: str | None) -> None:
    """Only a declaration read from the files names a runner; an undeclared
    graph or a config's word for one is a carton of files."""
    listed = {path: _file(b"x" * size) for path, size in files.items()}
    carton = files_carton("m", listed, origin="oci://r/m:1", fmt=fmt)
    assert parse_carton_toml(carton.small["carton.toml"]).runner.runner_name == "files"
