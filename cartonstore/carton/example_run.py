"""What `pack` learns from running a model once on example inputs: the
python and torchscript packers run the model through its runner's own
loading (the same ``load`` the daemon's runner process calls, so the
runner's load checks apply and the names and dtypes recorded are the ones
it will serve), in a child process (the model's code is the user's, and
may print, crash or hold memory), and write what it took and returned:
[[input]]/[[output]] tables and the run as a [[self_test]] with its
tensor_data/.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cartonstore.errors import InvalidInput

from .tensor_files import carton_dtype_of, write_tensors

RUN_TIMEOUT = 600   # seconds for the model's load and one run on the examples
_RUN = """
import json, sys
from pathlib import Path
import numpy as np
from cartonstore.format.carton_toml import TensorSpec
from cartonstore.runner.context import LoadError, RunnerContext
from cartonstore.runner.model_call import split_result
from importlib import import_module
runner, model_dir, opts, out, examples, dtypes = sys.argv[1:7]
load = import_module(f"cartonstore.runner.backends.{runner}").load
inputs = {name: np.load(path, allow_pickle=False) for name, path in json.loads(examples).items()}
# strings reach a model as object arrays, as the daemon sends them, not numpy's fixed-width str
inputs = {name: a.astype(object) if a.dtype.kind in "US" else a for name, a in inputs.items()}
ctx = RunnerContext(model_dir=Path(model_dir), socket_path=Path("unused"), devices=["cpu"], name="pack",
                    version="pack", opts=json.loads(opts), runner_name=runner,
                    inputs=[TensorSpec(n, d, "*") for n, d in json.loads(dtypes).items()])
try:
    model = load(ctx)
except LoadError as e:
    sys.exit(f"the runner refused the model: {e}")
outputs, _ = split_result(model.infer(inputs, {}))   # as the runner reads an answer (a dict by string name)
names = list(outputs)
for index, name in enumerate(names):   # files by position: a tensor's name may hold "/"
    array = np.asarray(outputs[name])
    if array.dtype.name == "bfloat16":   # carton format v1 has no bfloat16: declared float32
        array = array.astype(np.float32)
    if array.dtype.kind in "OU":
        flat = [v.decode() if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
        array = np.array(flat).reshape(array.shape)
    np.save(Path(out) / f"{index}.npy", array, allow_pickle=False)
(Path(out) / "names.json").write_text(json.dumps(names))   # not stdout: the model may print
"""


def load_arrays(flag: str, files: Mapping[str, Path]) -> dict[str, np.ndarray]:
    """INPUT=FILE.npy arguments read (InvalidInput naming one numpy cannot read)."""
    arrays = {}
    for name, file in files.items():
        try:
            arrays[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InvalidInput(f"{flag} {name}={file}: not a .npy file numpy reads: {e}", subject=str(file)) from None
    return arrays


def run_on_examples(runner: str, carton_dir: Path, opts: Mapping[str, Any], examples: Mapping[str, Path],
                    what: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Run the model in ``carton_dir`` (model/ in place) once on ``examples``
    through runner ``runner``: (inputs, outputs) as arrays. A model that
    fails, or that its runner refuses, is an InvalidInput with its stderr's
    last lines (``what`` names it: "--python entry.py:fn")."""
    if not examples:
        raise InvalidInput(f"{what}: give --example INPUT=FILE.npy for each input; the model is run once on them "
                           "to learn what it takes and returns")
    inputs = load_arrays("--example", examples)
    dtypes = {name: carton_dtype_of(array) for name, array in inputs.items()}
    with tempfile.TemporaryDirectory(prefix="cartonstore-pack-run-") as out:
        try:
            done = subprocess.run([sys.executable, "-c", _RUN, runner, str(carton_dir), json.dumps(dict(opts)),
                                   out, json.dumps({k: str(v) for k, v in examples.items()}), json.dumps(dtypes)],
                                  capture_output=True, text=True, errors="replace", timeout=RUN_TIMEOUT,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise InvalidInput(f"{what}: the model did not answer the examples within {RUN_TIMEOUT} s") from None
        lines = done.stderr.strip().splitlines()[-12:]
        answered = (Path(out) / "names.json").exists()
        if done.returncode == 0 and not answered:
            lines.append("(it ended before it answered: a model that calls sys.exit?)")
        if done.returncode != 0 or not answered:
            raise InvalidInput(f"{what}: the model failed on the examples:\n" +
                               "\n".join(f"  {line}" for line in lines), details={"stderr": lines})
        names = json.loads((Path(out) / "names.json").read_text())
        outputs = {n: np.load(Path(out) / f"{i}.npy", allow_pickle=False) for i, n in enumerate(names)}
    return inputs, outputs


def declarations(inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """carton.toml's "input" and "output" lists for a run: each tensor with
    the dtype and shape it had, the first dimension a shared symbol "batch"
    when every tensor has one of the same size."""
    arrays = [*inputs.values(), *outputs.values()]
    batched = all(array.ndim for array in arrays) and len({array.shape[0] for array in arrays}) == 1

    def table(name: str, array: np.ndarray) -> dict[str, Any]:
        return {"name": name, "dtype": carton_dtype_of(array),
                "shape": ["batch", *array.shape[1:]] if batched else list(array.shape)}
    # an input and an output may share a name
    return {"input": [table(n, a) for n, a in inputs.items()], "output": [table(n, a) for n, a in outputs.items()]}


def recorded_self_test(tensor_dir: Path, inputs: Mapping[str, np.ndarray],
                       outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Write the run to tensor_data/ and give its [[self_test]] table."""
    write_tensors(tensor_dir, {**{f"in_{k}": v for k, v in inputs.items()},
                               **{f"out_{k}": v for k, v in outputs.items()}})
    return {"name": "recorded", "description": "the model's answer when it was packed",
            "inputs": {k: f"@tensor_data/in_{k}" for k in inputs},
            "expected_out": {k: f"@tensor_data/out_{k}" for k in outputs}}
