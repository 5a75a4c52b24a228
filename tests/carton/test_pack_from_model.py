"""`cartonstore pack model.onnx`: a carton written from the graph (names,
dtypes, shapes with their symbols), the model where the onnx runner looks,
an optional recorded self-test that then passes through a real runner,
--dim and --name, and the refusals (a zipmap classifier, unknown symbols,
bad --self-test arguments). Round trips through `inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from kit.runnerkit import onnx_model_dir

from cartonstore.cli.commands import main


@pytest.fixture
def affine(tmp_path: Path) -> Path:
    """y = 2x + 1 on float32 x [N, 4], as a bare .onnx file."""
    return onnx_model_dir(tmp_path / "src", name="affine", ids=False) / "model" / "model.onnx"


def _inspect(path: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["inspect", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_carton_from_an_onnx_file_round_trips_and_self_tests(affine: Path, tmp_path: Path, short_tmp: Path,
                                                               capsys) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "affine.carton"
    assert main(["pack", str(affine), "-o", str(out), "--name", "affine", "--self-test", f"x={tmp_path / 'x.npy'}",
                 "--json"]) == 0
    doc = _inspect(out, capsys)
    assert doc["model_name"] == "affine" and doc["runner"]["runner_name"] == "onnx"
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["inputs"]] == [("x", "float32", ["N", 4])]
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["outputs"]] == [("y", "float32", ["N", 4])]
    assert {f["path"] for f in doc["files"]} >= {"carton.toml", "model/model.onnx", "tensor_data/index.toml"}
    assert doc["self_tests"] == 1
    # the recorded answer is the model's: its self-test passes through a runner of its own
    capsys.readouterr()
    # (a short root: the runner's socket lives under it)
    assert main(["selftest", str(out), "--root", str(short_tmp / "root"), "--json"]) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and [t["outcome"] for t in report["tests"]] == ["passed"]


def test_dims_are_renamed_or_fixed_and_a_directory_works(affine: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "a.carton"
    assert main(["pack", str(affine), "-o", str(out), "--dim", "N=batch"]) == 0
    assert _inspect(out, capsys)["inputs"][0]["shape"] == ["batch", 4]
    assert main(["pack", str(affine.parent), "-o", str(out), "--dim", "N=2"]) == 0   # the directory holding it
    doc = _inspect(out, capsys)
    assert doc["inputs"][0]["shape"] == [2, 4] and doc["model_name"] == "model"


def _zipmap_file(dest: Path) -> Path:
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Softmax", ["X"], ["probs"], axis=1),
             helper.make_node("ZipMap", ["probs"], ["output_probability"], domain="ai.onnx.ml",
                              classlabels_int64s=[0, 1])]
    out = helper.make_value_info("output_probability", helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    graph = helper.make_graph(nodes, "zip", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 8
    dest.write_bytes(model.SerializeToString())
    return dest


@pytest.mark.parametrize("extra,words", [
    (["--dim", "Q=1"], "--dim names 'Q', which the graph does not use (its symbols: N)"),
    (["--dim", "N"], "expected SYMBOL=SIZE or SYMBOL=NEW_SYMBOL"),
    (["--self-test", "x"], "expected INPUT=FILE.npy"),
    (["--self-test", "z=nowhere.npy"], "the model's inputs are x; not inputs: z; missing: x"),
    (["--self-test", "x=nowhere.npy"], "not a .npy file numpy reads"),
])
def test_bad_arguments_are_refused_naming_them(affine: Path, tmp_path: Path, capsys, extra, words) -> None:
    out = tmp_path / "a.carton"
    assert main(["pack", str(affine), "-o", str(out), *extra]) == 4
    assert words in capsys.readouterr().err and not out.exists()


def test_a_zipmap_classifier_and_other_mistakes_are_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "z.carton"
    assert main(["pack", str(_zipmap_file(tmp_path / "zip.onnx")), "-o", str(out)]) == 4
    err = capsys.readouterr().err
    assert "output 'output_probability' is a sequence of maps" in err and "zipmap disabled" in err
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float64))
    model = onnx_model_dir(tmp_path / "src", name="affine", ids=False) / "model" / "model.onnx"
    assert main(["pack", str(model), "-o", str(out), "--self-test", f"x={tmp_path / 'x.npy'}"]) == 4
    assert "the array is float64, the model takes float32" in capsys.readouterr().err
    assert main(["pack", str(model.parent.parent), "-o", str(out), "--name", "x"]) == 4   # a carton directory
    assert "is a carton directory" in capsys.readouterr().err
    (tmp_path / "two").mkdir()
    for n in ("a.onnx", "b.onnx"):
        (tmp_path / "two" / n).write_bytes(model.read_bytes())
    assert main(["pack", str(tmp_path / "two"), "-o", str(out)]) == 4
    assert "holds no carton.toml and 2 model files (.onnx, .pt)" in capsys.readouterr().err
    assert not out.exists()


ENTRY = '''
import numpy as np
from helper import scale

class Model:
    def infer_with_tensors(self, tensors):
        if tensors["x"].flat[0] < 0:
            raise ValueError("negative input, on purpose")
        return {"y": tensors["x"] * scale(), "tag": np.array(["t"] * len(tensors["x"]), dtype=object)}

def get_model():
    return Model()
'''


def _python_model(tmp_path: Path) -> Path:
    (tmp_path / "py").mkdir()
    (tmp_path / "py" / "entry.py").write_text(ENTRY)
    (tmp_path / "py" / "helper.py").write_text("def scale():\n    return 3\n")
    return tmp_path / "py" / "entry.py"


def test_a_carton_from_a_python_model_records_its_run(tmp_path: Path, short_tmp: Path, capsys) -> None:
    entry = _python_model(tmp_path)
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    out = tmp_path / "py.carton"
    assert main(["pack", "--python", f"{entry}:get_model", "--example", f"x={tmp_path / 'x.npy'}", "-o", str(out),
                 "--name", "tripler"]) == 0
    doc = _inspect(out, capsys)
    assert doc["model_name"] == "tripler" and doc["runner"]["opts"] == {"entrypoint_package": "entry",
                                                                       "entrypoint_fn": "get_model"}
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["inputs"]] == [("x", "float32", ["batch", 3])]
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["outputs"]] == [("y", "float32", ["batch", 3]),
                                                                              ("tag", "string", ["batch"])]
    assert {"model/entry.py", "model/helper.py"} <= {f["path"] for f in doc["files"]}   # its directory, imports too
    capsys.readouterr()
    assert main(["selftest", str(out), "--root", str(short_tmp / "root"), "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["passed"]


def test_a_python_model_that_fails_or_is_misnamed_is_refused(tmp_path: Path, capsys) -> None:
    entry = _python_model(tmp_path)
    np.save(tmp_path / "neg.npy", -np.ones((1, 3), np.float32))
    out = tmp_path / "py.carton"
    assert main(["pack", "--python", f"{entry}:get_model", "--example", f"x={tmp_path / 'neg.npy'}",
                 "-o", str(out), "--json"]) == 4
    err = json.loads(capsys.readouterr().err)
    assert "the model failed on the examples" in err["error"] and "negative input, on purpose" in err["stderr"][-1]
    for args, words in (([f"{entry}"], "expected FILE.py:FUNCTION"),
                        ([f"{tmp_path / 'nope.py'}:get_model"], "is not a file"),
                        ([f"{entry}:get_model"], "give --example INPUT=FILE.npy for each input")):
        assert main(["pack", "--python", *args, "-o", str(out)]) == 4
        assert words in capsys.readouterr().err
    assert main(["pack", str(tmp_path), "--python", f"{entry}:get_model", "-o", str(out)]) == 4
    assert "one of them" in capsys.readouterr().err
    assert not out.exists()


ODD = '''
import numpy as np
print("loading the model")   # a model that talks on stdout

class Model:
    def infer_with_tensors(self, tensors):
        print("inferring")
        return {"x": tensors["x"].sum(axis=1).astype(np.int64), "dense/BiasAdd:0": tensors["x"] * 2}

def get_model():
    return Model()
'''


def test_python_models_that_print_and_share_names_pack_and_self_test(tmp_path: Path, short_tmp: Path,
                                                                      capsys) -> None:
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "main.py").write_text(ODD)
    np.save(tmp_path / "x.npy", np.ones((4, 3), np.float32))
    out = tmp_path / "odd.carton"
    assert main(["pack", "--python", f"{tmp_path / 'odd' / 'main.py'}:get_model", "--example",
                 f"x={tmp_path / 'x.npy'}", "-o", str(out)]) == 0, capsys.readouterr().err
    doc = _inspect(out, capsys)
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["inputs"]] == [("x", "float32", ["batch", 3])]
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["outputs"]] == [("x", "int64", ["batch"]),
                                                                              ("dense/BiasAdd:0", "float32",
                                                                               ["batch", 3])]
    capsys.readouterr()
    assert main(["selftest", str(out), "--root", str(short_tmp / "root"), "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["passed"]


def test_an_onnx_output_of_unknown_shape_is_declared_any_shape(tmp_path: Path, short_tmp: Path, capsys) -> None:
    import onnx
    from onnx import TensorProto, helper

    unknown = onnx.ValueInfoProto(name="y")          # an element type and no shape at all, as converters leave
    unknown.type.tensor_type.elem_type = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [12]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, [2])], [unknown])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (tmp_path / "r.onnx").write_bytes(model.SerializeToString())
    np.save(tmp_path / "x.npy", np.arange(12, dtype=np.float32))
    np.save(tmp_path / "shape.npy", np.array([2, 6], np.int64))
    out = tmp_path / "r.carton"
    assert main(["pack", str(tmp_path / "r.onnx"), "-o", str(out), "--self-test", f"x={tmp_path / 'x.npy'}",
                 "--self-test", f"shape={tmp_path / 'shape.npy'}"]) == 0, capsys.readouterr().err
    assert _inspect(out, capsys)["outputs"][0]["shape"] == "*"
    capsys.readouterr()
    assert main(["selftest", str(out), "--root", str(short_tmp / "root")]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("body,words", [
    ("import sys\n        sys.exit(0)", "it ended before it answered"),
    ("import sys\n        sys.stderr.buffer.write(b'\\\\xff\\\\xfe not utf-8\\\\n'); sys.stderr.flush()\n"
     "        raise RuntimeError('bytes on stderr, on purpose')", "bytes on stderr, on purpose"),
    ("return [tensors['x']]", "the model returned list, not a dict of output name to tensor"),
    ("return {1: tensors['x']}", "output names must be strings"),
], ids=["exits", "non-utf8-stderr", "a-list", "int-names"])
def test_a_python_model_that_misbehaves_on_its_examples_is_refused(tmp_path: Path, capsys, body: str,
                                                                    words: str) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "main.py").write_text(
        f"class Model:\n    def infer_with_tensors(self, tensors):\n        {body}\n\n"
        "def get_model():\n    return Model()\n")
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    out = tmp_path / "bad.carton"
    assert main(["pack", "--python", f"{tmp_path / 'bad' / 'main.py'}:get_model", "--example",
                 f"x={tmp_path / 'x.npy'}", "-o", str(out), "--json"]) == 4
    err = json.loads(capsys.readouterr().err)
    assert "the model failed on the examples" in err["error"] and words in err["error"], err
    assert not out.exists()
