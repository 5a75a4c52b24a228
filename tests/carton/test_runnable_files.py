"""runnable_carton_toml (from_model.py): model files a source staged get
the onnx runner's declaration when they are one .onnx graph, as `pack`
writes it, the graph named where its source put it; any other files
(weights of a format no runner serves, two graphs) get None."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from kit.modelfiles import gguf_file, safetensors_file
from kit.runnerkit import onnx_model_dir

from cartonstore.carton.from_files import ListedFile, files_carton
from cartonstore.carton.from_model import onnx_carton_dir, runnable_carton_toml
from cartonstore.format.carton_toml import parse_carton_toml


def _graph(tmp_path: Path) -> Path:
    return onnx_model_dir(tmp_path / "src", name="affine", ids=False) / "model" / "model.onnx"


def _listed(staged: dict[str, Path]) -> dict[str, ListedFile]:
    return {path: ListedFile(hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_size)
            for path, f in staged.items()}


def test_one_graph_gets_packs_declaration_and_runs_where_its_source_put_it(tmp_path: Path, short_tmp: Path) -> None:
    graph = _graph(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("an affine map\n")
    staged = {"onnx/affine.onnx": graph, "README.md": readme}
    toml = runnable_carton_toml("org/affine", staged)
    assert toml is not None
    config = parse_carton_toml(toml)
    packed = parse_carton_toml((onnx_carton_dir(graph, tmp_path / "packed", name="org/affine")
                                / "carton.toml").read_bytes())
    assert (config.inputs, config.outputs, config.runner.runner_name, config.runner.required_framework_version) \
        == (packed.inputs, packed.outputs, "onnx", packed.runner.required_framework_version)
    assert config.runner.opts == {"model_file": "onnx/affine.onnx"}

    carton = files_carton("org/affine", _listed(staged), origin="test", carton_toml=toml)
    unpacked = tmp_path / "carton"
    for path, source in staged.items():
        (unpacked / "model" / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, unpacked / "model" / path)
    (unpacked / "carton.toml").write_bytes(carton.small["carton.toml"])
    root = str(short_tmp / "root")   # short: the runner's socket lives under it
    cli = [sys.executable, "-m", "cartonstore.cli"]
    subprocess.run([*cli, "add", str(unpacked), "--name", "affine", "--root", root], check=True, timeout=120)
    done = subprocess.run([*cli, "infer", "affine", "--input", "x=[[1, 2, 3, 4]]", "--root", root,
                           "--socket", str(short_tmp / "none.sock")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "[[3. 5. 7. 9.]]" in done.stdout


def test_a_graph_named_model_onnx_needs_no_option(tmp_path: Path) -> None:
    toml = runnable_carton_toml("m", {"model.onnx": _graph(tmp_path)})
    assert toml is not None and parse_carton_toml(toml).runner.opts == {}


def test_files_no_runner_serves_or_two_graphs_get_none(tmp_path: Path) -> None:
    graph = _graph(tmp_path)
    weights = safetensors_file(tmp_path / "w.safetensors", {"w": ("F32", (2, 2))})
    assert runnable_carton_toml("m", {"model.onnx": graph, "model.safetensors": weights}) is None
    assert runnable_carton_toml("m", {"a.onnx": graph, "b.onnx": graph}) is None
    assert runnable_carton_toml("m", {"m.gguf": gguf_file(tmp_path / "m.gguf")}) is None
    assert runnable_carton_toml("m", {"tokenizer.json": weights}) is None


def test_the_daemon_reads_the_graph_without_onnxruntime(tmp_path: Path) -> None:
    """Sources run in the daemon: the graph is read by the ONNX wire format
    parser; onnxruntime, which loads and optimizes a graph, is not imported."""
    graph = _graph(tmp_path)
    code = ("import sys; from pathlib import Path; from cartonstore.carton.from_model import runnable_carton_toml; "
            f"assert runnable_carton_toml('m', {{'model.onnx': Path({str(graph)!r})}}) is not None; "
            "assert 'onnxruntime' not in sys.modules, 'onnxruntime was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_file_onnxruntime_cannot_read_gets_none(tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a graph")
    assert runnable_carton_toml("m", {"model.onnx": broken}) is None
