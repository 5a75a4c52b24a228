"""A model is checked against its carton.toml: an ONNX graph at load (each
mismatch refuses the load naming it; a zipmap classifier is refused at
load, not at its first infer), and what any model returns at infer (an
undeclared output, another dtype or shape is a 500 naming it). Real
daemons and runners; the ONNX models are built here with onnx.helper, as
skl2onnx writes a classifier: X -> label (int64) and probabilities."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from kit.daemonkit import DaemonProcess, call
from kit.runnerkit import carton_toml, save_scripted
from tritonclient.utils import InferenceServerException


def _classifier(dest: Path, *, zipmap: bool, inputs: list, outputs: list) -> Path:
    """A 3-class 'classifier' on float32 X [N, 4]: probabilities = softmax(X[:, :3]),
    label = argmax; with zipmap, probabilities as ai.onnx.ml's ZipMap makes them
    (a sequence of maps), as skl2onnx's default does."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Slice", ["X", "starts", "ends", "axes"], ["first3"]),
             helper.make_node("Softmax", ["first3"], ["probs"], axis=1),
             helper.make_node("ArgMax", ["probs"], ["label"], axis=1, keepdims=0)]
    outs = [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"])]
    if zipmap:
        nodes.append(helper.make_node("ZipMap", ["probs"], ["output_probability"], domain="ai.onnx.ml",
                                      classlabels_int64s=[0, 1, 2]))
        outs.append(helper.make_value_info("output_probability", helper.make_sequence_type_proto(
            helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))))
    else:
        nodes.append(helper.make_node("Identity", ["probs"], ["probabilities"]))
        outs.append(helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 3]))
    consts = [helper.make_tensor("starts", TensorProto.INT64, [1], [0]),
              helper.make_tensor("ends", TensorProto.INT64, [1], [3]),
              helper.make_tensor("axes", TensorProto.INT64, [1], [1])]
    graph = helper.make_graph(nodes, "classifier", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
                              outs, consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    (dest / "model").mkdir(parents=True)
    (dest / "model" / "model.onnx").write_bytes(model.SerializeToString())
    (dest / "carton.toml").write_text(carton_toml("onnx", ">=1.10", {"intra_op_num_threads": 1},
                                                  model_name=dest.name, inputs=inputs, outputs=outputs))
    return dest


X = [("X", "float32", ["N", 4])]
RIGHT = [("label", "int64", ["N"]), ("probabilities", "float32", ["N", 3])]


def _load(d: DaemonProcess, name: str, src: Path) -> tuple[int, dict]:
    return call(d, "POST", f"/v2/repository/models/{name}/load", json={"parameters": {"source": str(src)}})


def test_a_graph_that_matches_loads_and_serves(daemon: DaemonProcess, tmp_path: Path) -> None:
    status, body = _load(daemon, "good", _classifier(tmp_path / "good", zipmap=False, inputs=X, outputs=RIGHT))
    assert status == 200, body
    c = triton.InferenceServerClient(daemon.host_port)
    x = triton.InferInput("X", [2, 4], "FP32")
    x.set_data_from_numpy(np.array([[0, 5, 0, 9], [3, 0, 0, 9]], np.float32))
    out = c.infer("good", [x])
    assert out.as_numpy("label").tolist() == [1, 0] and out.as_numpy("label").dtype == np.int64
    assert out.as_numpy("probabilities").shape == (2, 3)
    c.close()


@pytest.mark.parametrize("inputs,outputs,zipmap,words", [
    (X, [("label", "int64", ["N"]), ("output_probability", "float32", ["N", 3])], True,
     ["output 'output_probability' is a sequence of maps (seq(map(int64,tensor(float)))): cartonstore serves "
      "tensors; convert with zipmap disabled"]),
    (X, [("output_label", "int64", ["N"]), ("output_probability", "float32", ["N", 3])], False,
     ["output 'output_label' is not in the model's graph (its outputs: 'label', 'probabilities')",
      "output 'output_probability' is not in the model's graph"]),
    (X, [("label", "int32", ["N"]), ("probabilities", "float32", ["N", 3])], False,
     ["output 'label' is int64 in the graph but int32 in carton.toml"]),
    ([("features", "float32", ["N", 4])], RIGHT, False,
     ["input 'features' is not in the model's graph (its inputs: 'X')",
      "the graph needs input(s) 'X' that carton.toml does not declare"]),
    ([("X", "float32", ["N", 5])], RIGHT, False, ["input 'X' dimension 1 is 4 in the graph but 5 in carton.toml"]),
    ([("X", "float32", ["N"])], RIGHT, False, ["input 'X' has rank 2 in the graph (['N', 4]) but 1 in carton.toml"]),
], ids=["zipmap", "renamed-outputs", "int32-label", "renamed-input", "fixed-dim", "rank"])
def test_every_mismatch_refuses_the_load_naming_it(daemon: DaemonProcess, tmp_path: Path, inputs, outputs,
                                                   zipmap, words) -> None:
    status, body = _load(daemon, "m", _classifier(tmp_path / "m", zipmap=zipmap, inputs=inputs, outputs=outputs))
    assert status == 400, body
    assert body["error"].startswith("failed to load 'm': runner for m failed to start: ")
    assert "model.onnx does not match carton.toml: " in body["error"]
    for w in words:
        assert w in body["error"], (w, body["error"])
    status, rows = call(daemon, "POST", "/v2/repository/index", json={})
    assert {r["name"]: r["state"] for r in rows}["m"] == "UNAVAILABLE"


RETURNS = '''
import numpy as np

class Model:
    def infer_with_tensors(self, tensors):
        kind = int(tensors["x"].flat[0])
        y = tensors["x"].astype(np.float32)
        return [{"y": y}, {"y": y, "extra": y}, {"y": y.astype(np.float64)}, {"y": y.reshape(-1)},
                {"y": y, "s": np.array([b"a"], dtype=object)}][kind]

def get_model():
    return Model()
'''


def test_outputs_are_checked_at_infer(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = tmp_path / "py"
    (src / "model").mkdir(parents=True)
    (src / "model" / "main.py").write_text(RETURNS)
    (src / "carton.toml").write_text(carton_toml(
        "python", ">=3.8", {"entrypoint_package": "main", "entrypoint_fn": "get_model"}, model_name="py",
        inputs=[("x", "int32", ["n", 2])], outputs=[("y", "float32", ["n", 2]), ("s", "string", [1])]))
    assert _load(daemon, "py", src)[0] == 200
    c = triton.InferenceServerClient(daemon.host_port)

    def infer(kind: int) -> triton.InferResult:
        x = triton.InferInput("x", [1, 2], "INT32")
        x.set_data_from_numpy(np.array([[kind, 0]], np.int32))
        return c.infer("py", [x])
    assert infer(0).as_numpy("y").tolist() == [[0.0, 0.0]]
    for kind, words in ((1, "the model returned output 'extra', which carton.toml does not declare ('y', 's')"),
                        (2, "output 'y' is float64 but carton.toml declares float32"),
                        (3, "output 'y' has shape [2] but carton.toml declares ['n', 2]")):
        with pytest.raises(InferenceServerException, match=r"^\[500\] " + words.replace("(", r"\(").replace(
                ")", r"\)").replace("[", r"\[").replace("]", r"\]")):
            infer(kind)
    assert infer(4).as_numpy("s").tolist() == [b"a"]
    c.close()


TWO_RESULTS = '''
import torch
from typing import Tuple

class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor, k: int = 2) -> Tuple[torch.Tensor, torch.Tensor]:
        return x * k, x.sum(dim=1)
'''


def _torchscript(dest: Path, inputs: list, outputs: list) -> Path:
    """A scripted TorchScript model taking x (and an int with a default), returning two tensors."""
    pytest.importorskip("torch", reason="torch is not installed in this environment")
    save_scripted(TWO_RESULTS, "Model", dest / "model" / "model.pt")
    (dest / "carton.toml").write_text(carton_toml("torchscript", ">=2.0", {"num_threads": 1}, model_name=dest.name,
                                                  inputs=inputs, outputs=outputs))
    return dest


TS_IN = [("x", "float32", ["N", 3])]
TS_OUT = [("doubled", "float32", ["N", 3]), ("total", "float32", ["N"])]


@pytest.mark.slow
def test_a_torchscript_model_that_matches_loads_and_names_its_results(daemon: DaemonProcess, tmp_path: Path) -> None:
    status, body = _load(daemon, "ts", _torchscript(tmp_path / "ts", TS_IN, TS_OUT))
    assert status == 200, body
    c = triton.InferenceServerClient(daemon.host_port)
    x = triton.InferInput("x", [2, 3], "FP32")
    x.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    out = c.infer("ts", [x])
    assert out.as_numpy("doubled").tolist() == [[0, 2, 4], [6, 8, 10]] and out.as_numpy("total").tolist() == [3, 12]
    c.close()


@pytest.mark.parametrize("inputs,outputs,words", [
    ([("features", "float32", ["N", 3])], TS_OUT,
     ["input 'features' is not an argument of forward (its arguments: 'x', 'k')",
      "forward needs argument(s) 'x' that carton.toml does not declare"]),
    ([("x", "string", ["N"])], TS_OUT,
     ["input 'x' is string in carton.toml, which the runner passes as str or List[str], but forward's argument is "
      "Tensor"]),
    (TS_IN, TS_OUT[:1],
     ["forward returns 2 value(s) (Tuple[Tensor, Tensor]) but carton.toml declares 1 output(s): 'doubled'"]),
], ids=["renamed-input", "string-input", "one-output"])
@pytest.mark.slow
def test_a_torchscript_mismatch_refuses_the_load_naming_it(daemon: DaemonProcess, tmp_path: Path, inputs, outputs,
                                                           words) -> None:
    status, body = _load(daemon, "tsm", _torchscript(tmp_path / "tsm", inputs, outputs))
    assert status == 400, body
    assert "model.pt does not match carton.toml: " in body["error"]
    for w in words:
        assert w in body["error"], (w, body["error"])


LISTS = '''
class Model:
    def infer_with_tensors(self, tensors):
        kind = int(tensors["x"].flat[0])
        return {"y": [[1, 2], [0.7, 1.9], [2 ** 40, 1]][kind]}

def get_model():
    return Model()
'''


def test_a_python_list_takes_the_declared_dtype_only_when_it_fits(daemon: DaemonProcess, tmp_path: Path) -> None:
    """Floats are never cut to a declared integer, nor big integers wrapped:
    such an output is refused naming what it is."""
    src = tmp_path / "lists"
    (src / "model").mkdir(parents=True)
    (src / "model" / "main.py").write_text(LISTS)
    (src / "carton.toml").write_text(carton_toml(
        "python", ">=3.8", {"entrypoint_package": "main", "entrypoint_fn": "get_model"}, model_name="lists",
        inputs=[("x", "int32", [1])], outputs=[("y", "int32", [2])]))
    assert _load(daemon, "lists", src)[0] == 200
    c = triton.InferenceServerClient(daemon.host_port)

    def infer(kind: int) -> triton.InferResult:
        x = triton.InferInput("x", [1], "INT32")
        x.set_data_from_numpy(np.array([kind], np.int32))
        return c.infer("lists", [x])
    out = infer(0).as_numpy("y")
    assert out.tolist() == [1, 2] and out.dtype == np.int32
    for kind, words in ((1, "output 'y' is float64 but carton.toml declares int32"),
                        (2, "output 'y' is int64 but carton.toml declares int32")):
        with pytest.raises(InferenceServerException, match=r"^\[500\] " + words):
            infer(kind)
    c.close()
