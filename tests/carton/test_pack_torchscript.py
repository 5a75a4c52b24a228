"""`cartonstore pack model.pt --example x=x.npy`: a carton written from a
run of a real TorchScript file (traced or scripted) through the
torchscript runner's own loading: names from forward's arguments and from
what it returns, dtypes and shapes from the run, a shared "batch" first
dimension, and the run recorded as a self-test that then passes through a
real runner process. The refusals name the problem. Needs torch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from kit.runnerkit import save_scripted

from cartonstore.cli.commands import main

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")

SCRIPTED = '''
import torch
from typing import List, Tuple

class Scorer(torch.nn.Module):
    def forward(self, features: torch.Tensor, ids: torch.Tensor, scale: float = 2.0) -> Tuple[torch.Tensor, torch.Tensor]:
        return features.sum(dim=1) * scale, ids + 1
'''


def _traced_mlp(dest: Path) -> Path:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    torch.jit.trace(mlp, torch.zeros(1, 4)).save(str(dest))
    return dest


def _scripted(tmp_path: Path) -> Path:
    return save_scripted(SCRIPTED, "Scorer", tmp_path / "scorer.pt")


def _inspect(path: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["inspect", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _selftest_passes(carton: Path, root: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["selftest", str(carton), "--root", str(root), "--json"]) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and [t["outcome"] for t in report["tests"]] == ["passed"]


@pytest.mark.slow
def test_a_traced_model_packs_from_its_file_and_example(tmp_path: Path, short_tmp: Path, capsys) -> None:
    model = _traced_mlp(tmp_path / "mlp.pt")
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "mlp.carton"
    # a traced module's one argument is named "input"
    assert main(["pack", str(model), "--example", f"input={tmp_path / 'x.npy'}", "-o", str(out)]) == 0, \
        capsys.readouterr().err
    doc = _inspect(out, capsys)
    assert doc["model_name"] == "mlp" and doc["runner"]["runner_name"] == "torchscript"
    assert doc["runner"]["required_framework_version"] == ">=2.0"
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["inputs"]] == [("input", "float32", ["batch", 4])]
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["outputs"]] == [("output0", "float32", ["batch", 3])]
    assert {f["path"] for f in doc["files"]} >= {"carton.toml", "model/model.pt", "tensor_data/index.toml"}
    assert doc["self_tests"] == 1
    _selftest_passes(out, short_tmp / "root", capsys)
    # a directory holding the one .pt works the same
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "mlp.pt").write_bytes(model.read_bytes())
    assert main(["pack", str(tmp_path / "d"), "--example", f"input={tmp_path / 'x.npy'}", "--name", "m",
                 "-o", str(out)]) == 0
    assert _inspect(out, capsys)["model_name"] == "m"


@pytest.mark.slow
def test_a_scripted_model_records_its_arguments_and_every_result(tmp_path: Path, short_tmp: Path,
                                                                  capsys) -> None:
    model = _scripted(tmp_path)
    np.save(tmp_path / "f.npy", np.ones((3, 2), np.float64))
    np.save(tmp_path / "ids.npy", np.arange(3, dtype=np.int64))
    out = tmp_path / "scorer.carton"
    assert main(["pack", str(model), "--example", f"features={tmp_path / 'f.npy'}", "--example",
                 f"ids={tmp_path / 'ids.npy'}", "-o", str(out)]) == 0, capsys.readouterr().err
    doc = _inspect(out, capsys)
    # scale has a default: it is not an input
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["inputs"]] == [("features", "float64", ["batch", 2]),
                                                                             ("ids", "int64", ["batch"])]
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["outputs"]] == [("output0", "float64", ["batch"]),
                                                                              ("output1", "int64", ["batch"])]
    _selftest_passes(out, short_tmp / "root", capsys)


@pytest.mark.slow
def test_mistakes_are_refused_naming_them(tmp_path: Path, capsys) -> None:
    model = _scripted(tmp_path)
    np.save(tmp_path / "f.npy", np.ones((3, 2), np.float32))
    np.save(tmp_path / "ids.npy", np.arange(3, dtype=np.int64))
    out = tmp_path / "bad.carton"
    f, ids = f"features={tmp_path / 'f.npy'}", f"ids={tmp_path / 'ids.npy'}"
    for args, words in (
        ([], "give --example INPUT=FILE.npy for each input"),
        (["--example", f], "forward needs argument(s) 'ids' that carton.toml does not declare"),
        (["--example", f, "--example", ids, "--example", f"extra={tmp_path / 'f.npy'}"],
         "input 'extra' is not an argument of forward (its arguments: 'features', 'ids', 'scale')"),
        (["--example", f"features={tmp_path / 'ids.npy'}", "--example", ids], "the model failed on the examples"),
        (["--example", f"features={tmp_path / 'none.npy'}", "--example", ids], "not a .npy file numpy reads"),
        (["--example", f, "--example", ids, "--dim", "batch=2"], "--dim and --self-test apply to an .onnx file"),
        (["--example", f, "--example", ids, "--self-test", f], "--dim and --self-test apply to an .onnx file"),
    ):
        assert main(["pack", str(model), "-o", str(out), "--json", *args]) == 4, args
        err = json.loads(capsys.readouterr().err)
        assert words in err["error"], (words, err)
    (tmp_path / "garbage.pt").write_bytes(b"not a zip")
    assert main(["pack", str(tmp_path / "garbage.pt"), "--example", f, "-o", str(out)]) == 4
    assert "torch.jit.load cannot load model.pt" in capsys.readouterr().err
    assert not out.exists()


def test_example_is_refused_for_an_onnx_file(tmp_path: Path, capsys) -> None:
    from kit.runnerkit import onnx_model_dir

    model = onnx_model_dir(tmp_path / "src", name="affine", ids=False) / "model" / "model.onnx"
    assert main(["pack", str(model), "--example", "x=x.npy", "-o", str(tmp_path / "a.carton")]) == 4
    assert "--example is for a .pt file or --python" in capsys.readouterr().err


WORDS = '''
import torch
from typing import List

class Lengths(torch.nn.Module):
    def forward(self, words: List[str]) -> torch.Tensor:
        return torch.tensor([len(w) for w in words])
'''


@pytest.mark.slow
def test_a_model_taking_strings_packs_from_a_numpy_string_array(tmp_path: Path, short_tmp: Path,
                                                                 capsys) -> None:
    model = save_scripted(WORDS, "Lengths", tmp_path / "lengths.pt")
    np.save(tmp_path / "w.npy", np.array(["a", "héllo", ""]))   # numpy's fixed-width str, as users save them
    out = tmp_path / "lengths.carton"
    assert main(["pack", str(model), "--example", f"words={tmp_path / 'w.npy'}", "-o", str(out)]) == 0, \
        capsys.readouterr().err
    doc = _inspect(out, capsys)
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["inputs"]] == [("words", "string", ["batch"])]
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["outputs"]] == [("output0", "int64", ["batch"])]
    _selftest_passes(out, short_tmp / "root", capsys)
