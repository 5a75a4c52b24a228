"""A carton made from an ONNX file: `cartonstore pack model.onnx -o m.carton`
(from_torchscript.py does .pt files).

carton.toml is written from the graph's inputs and outputs: each with its
name, dtype and shape (a dimension the graph names, such as "N" or "batch",
stays a symbol; one it leaves unnamed becomes a symbol of its own), runner
"onnx", and the file where that runner expects it (model/model.onnx).
``pack`` reads them with onnxruntime, which it runs for self-tests anyway;
a graph a source fetched (runnable_carton_toml) is read by the ONNX wire
format parser (format.onnx_graph) alone, and one function declares both.
``dims`` renames a symbol or fixes it to a size; ``self_tests`` (input
name -> .npy file) runs the model once on those inputs and records the run
as a [[self_test]] with its outputs as the expected ones, so every load
checks the model still answers the same.

Outputs that are not tensors (a classifier converted with zipmap) are
refused here, naming the fix, as the onnx runner would refuse them at load.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cartonstore.errors import InvalidInput
from cartonstore.format.dtypes import ONNX_TO_CARTON, onnx_kind_text

if TYPE_CHECKING:
    from .from_files import FilesCarton

ONNX_FRAMEWORK = ">=1.10"   # what the graphs onnxruntime 1.10 reads (opsets up to 15) need; newer ones say more
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


MODEL_SUFFIXES = (".onnx", ".pt")   # what pack makes a carton of: ONNX (from_model), TorchScript (from_torchscript)


def model_file_in(path: Path) -> Path | None:
    """The model file ``pack`` should make a carton of: ``path`` itself (an
    .onnx or .pt file), or the one such file in a directory that holds no
    carton.toml; None for a carton directory."""
    if path.is_file() and path.suffix in MODEL_SUFFIXES:
        return path
    if path.is_dir() and not (path / "carton.toml").exists():
        found = sorted(p for p in path.iterdir() if p.suffix in MODEL_SUFFIXES and p.is_file())
        if len(found) == 1:
            return found[0]
        raise InvalidInput(f"{path} holds no carton.toml and {len(found)} model files (.onnx, .pt): give a carton "
                           f"directory or one model file", subject=str(path))
    return None


def parse_dims(items: list[str]) -> dict[str, str | int]:
    """``--dim SYMBOL=VALUE`` arguments: VALUE a size or a new symbol."""
    out: dict[str, str | int] = {}
    for item in items:
        symbol, sep, value = item.partition("=")
        if not sep or not _SYMBOL.fullmatch(symbol) or not (value.isdigit() or _SYMBOL.fullmatch(value)):
            raise InvalidInput(f"--dim {item!r}: expected SYMBOL=SIZE or SYMBOL=NEW_SYMBOL (batch=8, N=batch)",
                               subject=item)
        out[symbol] = int(value) if value.isdigit() else value
    return out


def _session(model: Path) -> Any:
    try:
        import onnxruntime as ort
    except ImportError:
        raise InvalidInput("making a carton from an .onnx file reads it with onnxruntime: "
                           "pip install 'cartonstore[onnx]'") from None
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        return ort.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise InvalidInput(f"onnxruntime cannot read {model}: {type(exc).__name__}: {exc}",
                           subject=str(model)) from None


def _declaration(arg: Any, role: str, dims: Mapping[str, str | int], used: set[str]) -> dict[str, Any]:
    dtype = ONNX_TO_CARTON.get(arg.type)
    if dtype is None:
        raise InvalidInput(f"{role} {arg.name!r} is {onnx_kind_text(arg.type)}", subject=arg.name)
    shape: list[Any] = []
    for axis, dim in enumerate(arg.shape or ()):
        if isinstance(dim, int) and dim >= 0:
            shape.append(dim)
            continue
        symbol = dim if isinstance(dim, str) and _SYMBOL.fullmatch(dim) else f"{arg.name}_{axis}"
        symbol = re.sub(r"\W", "_", symbol)
        used.add(symbol)
        shape.append(dims.get(symbol, symbol))
    entry: dict[str, Any] = {"name": arg.name, "dtype": dtype}
    # onnxruntime says [] for a shape it does not know (a scalar, too): any shape, then
    entry["shape"] = shape if arg.shape else "*"
    return entry


def _onnx_toml(graph_inputs: Sequence[Any], graph_outputs: Sequence[Any], name: str,
               dims: Mapping[str, str | int] = {}) -> dict[str, Any]:
    """carton.toml of a graph's inputs and outputs, the onnx runner. Each
    input and output has a name, an onnxruntime type name and a shape: the
    NodeArgs of an onnxruntime session or format.onnx_graph's OnnxValues."""
    used: set[str] = set()
    inputs = [_declaration(arg, "input", dims, used) for arg in graph_inputs]
    outputs = [_declaration(arg, "output", dims, used) for arg in graph_outputs]
    unknown = sorted(set(dims) - used)
    if unknown:
        raise InvalidInput(f"--dim names {', '.join(repr(u) for u in unknown)}, which the graph does not use "
                           f"(its symbols: {', '.join(sorted(used)) or 'none'})", subject=unknown[0])
    return {"spec_version": 1, "model_name": name, "input": inputs, "output": outputs,
            "runner": {"runner_name": "onnx", "required_framework_version": ONNX_FRAMEWORK,
                       "runner_compat_version": 1}}


def onnx_carton_dir(model: Path, work: Path, *, name: str | None = None, dims: Mapping[str, str | int] = {},
                    self_tests: Mapping[str, Path] = {}) -> Path:
    """An unpacked carton in ``work`` (made here) for the ONNX file ``model``."""
    import tomli_w

    session = _session(model)
    toml = _onnx_toml(session.get_inputs(), session.get_outputs(), name or model.stem, dims)
    (work / "model").mkdir(parents=True)
    place_file(model, work / "model" / "model.onnx")
    if self_tests:
        toml["self_test"] = [_record_self_test(session, work / "tensor_data", self_tests)]
    (work / "carton.toml").write_text(tomli_w.dumps(toml))
    return work


def runnable_carton_toml(model_name: str, staged: Mapping[str, Path]) -> bytes | None:
    """carton.toml that runs model files a source staged (its path -> the
    staged file) where a runner serves them: one .onnx graph and no other
    weights gets the onnx runner's declaration, as ``pack`` writes it. The
    files stay where from_files puts them (``model/PATH``), so a graph not
    named model.onnx is named by ``[runner.opts] model_file``, and external
    data files keep their place beside it. None for any other files, and
    for a graph the ONNX reader refuses (the files are then a carton of
    files, used through a lease)."""
    import tomli_w

    from .from_files import format_of_path

    graphs = [path for path in staged if format_of_path(path) == "onnx"]
    weights = [path for path in staged if format_of_path(path) not in (None, "onnx")]
    if len(graphs) != 1 or weights:
        return None
    toml = _graph_toml(model_name, graphs[0], staged[graphs[0]])
    if toml is None:
        return None
    if graphs[0] != "model.onnx":
        toml["runner"]["opts"] = {"model_file": graphs[0]}
    return tomli_w.dumps(toml).encode()


def _graph_toml(model_name: str, graph: str, file: Path) -> dict[str, Any] | None:
    """The declaration of the staged graph, read by the ONNX wire format
    parser alone: sources run in the daemon on files from anywhere, and
    onnxruntime's graph loading (optimizers, allocations) belongs in the
    runner's sandbox. The weights, inline or external, are not read."""
    from cartonstore.format.onnx_graph import parse_onnx_graph
    from cartonstore.format.read_at import read_at_file

    with open(file, "rb") as f:
        try:
            parsed = parse_onnx_graph(read_at_file(f), os.fstat(f.fileno()).st_size, file=f"model/{graph}")
            return _onnx_toml(parsed.inputs, parsed.outputs, model_name)
        except InvalidInput:
            return None


def place_file(src: Path, dest: Path) -> None:
    """A hard link where the file system allows (a model may be gigabytes), else a copy."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def _record_self_test(session: Any, tensor_dir: Path, given: Mapping[str, Path]) -> dict[str, Any]:
    import numpy as np

    from .example_run import load_arrays, recorded_self_test

    names = [arg.name for arg in session.get_inputs()]
    unknown = sorted(set(given) - set(names))
    missing = [n for n in names if n not in given]
    if unknown or missing:
        raise InvalidInput(f"--self-test: the model's inputs are {', '.join(names)}"
                           + (f"; not inputs: {', '.join(unknown)}" if unknown else "")
                           + (f"; missing: {', '.join(missing)}" if missing else ""))
    feed = load_arrays("--self-test", given)
    for arg in session.get_inputs():
        want = ONNX_TO_CARTON[arg.type]
        if want != "string" and feed[arg.name].dtype != np.dtype(want):
            raise InvalidInput(f"--self-test {arg.name}: the array is {feed[arg.name].dtype}, the model takes {want}",
                               subject=arg.name)
    try:
        results = session.run(None, feed)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise InvalidInput(f"--self-test: the model failed on the given inputs: {type(exc).__name__}: {exc}") from None
    outputs = {arg.name: value for arg, value in zip(session.get_outputs(), results, strict=True)}
    return recorded_self_test(tensor_dir, {arg.name: feed[arg.name] for arg in session.get_inputs()}, outputs)


def runnable_files_carton(carton: FilesCarton, model_name: str, file_at: Callable[[str], Path], *,
                          origin: str, description: str | None = None) -> FilesCarton:
    """``carton`` (from_files.files_carton) declared for the runner that
    serves its files where one does (runnable_carton_toml), else as it is.
    ``file_at(sha256)``: where a file's bytes are now (staged or stored).
    Reads the files: in a worker thread, once they are all staged."""
    from .from_files import files_carton, format_of_path

    files = carton.model_files()
    if not any(format_of_path(path) == "onnx" for path in files):
        return carton
    toml = runnable_carton_toml(model_name, {path: file_at(f.digest) for path, f in files.items()})
    if toml is None:
        return carton
    return files_carton(model_name, files, origin=origin, description=description, carton_toml=toml)
