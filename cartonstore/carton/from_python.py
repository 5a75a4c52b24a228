"""A carton made from a python model: `cartonstore pack --python
entry.py:get_model --example x=x.npy -o m.carton`.

The directory holding entry.py becomes the carton's model/ (so the model
may import its neighbours; __pycache__ and hidden files are left out), run
by the python runner (entrypoint_package = entry, entrypoint_fn =
get_model). The model is run once on the example inputs, in a child
process through the python runner's own loading, and the run is what
carton.toml records: each input and output with the dtype and shape it
had, the first dimension a shared symbol "batch" when every tensor has
one of the same size, and the run itself as a [[self_test]].
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cartonstore.errors import InvalidInput

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RUN = """
import json, sys
from pathlib import Path
import numpy as np
from cartonstore.runner.context import RunnerContext
from cartonstore.runner.python import load
model_dir, package, fn, out = sys.argv[1:5]
inputs = {name: np.load(path, allow_pickle=False) for name, path in json.loads(sys.argv[5]).items()}
ctx = RunnerContext(model_dir=Path(model_dir), socket_path=Path("unused"), devices=["cpu"], name="pack",
                    version="pack", opts={"entrypoint_package": package, "entrypoint_fn": fn})
outputs = load(ctx).infer(inputs, {})
outputs = getattr(outputs, "outputs", outputs)
names = list(outputs)
for index, name in enumerate(names):   # files by position: a tensor's name may hold "/"
    array = np.asarray(outputs[name])
    if array.dtype.kind in "OU":
        flat = [v.decode() if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
        array = np.array(flat).reshape(array.shape)
    np.save(Path(out) / f"{index}.npy", array, allow_pickle=False)
(Path(out) / "names.json").write_text(json.dumps(names))   # not stdout: the model may print
"""


def parse_entry(entry: str) -> tuple[Path, str]:
    """``path/entry.py:get_model`` -> (the file, the function's name)."""
    file_text, sep, fn = entry.rpartition(":")
    path = Path(file_text)
    if not sep or not _IDENTIFIER.fullmatch(fn) or path.suffix != ".py" or not _IDENTIFIER.fullmatch(path.stem):
        raise InvalidInput(f"--python {entry!r}: expected FILE.py:FUNCTION (model.py:get_model)", subject=entry)
    if not path.is_file():
        raise InvalidInput(f"--python {entry!r}: {path} is not a file", subject=entry)
    return path, fn


def _batched(arrays: list[Any]) -> bool:
    """Every tensor of the run has a first dimension, of one size: a batch."""
    return all(array.ndim for array in arrays) and len({array.shape[0] for array in arrays}) == 1


def _declaration(name: str, array: Any, batched: bool) -> dict[str, Any]:
    """An [[input]]/[[output]] table from an array of the run."""
    from .tensor_files import carton_dtype_of

    return {"name": name, "dtype": carton_dtype_of(array),
            "shape": ["batch", *array.shape[1:]] if batched else list(array.shape)}


def python_carton_dir(entry: str, work: Path, *, name: str | None, examples: Mapping[str, Path]) -> Path:
    """An unpacked carton in ``work`` (made here) for the python model ``entry``."""
    import numpy as np
    import tomli_w

    from .tensor_files import write_tensors

    path, fn = parse_entry(entry)
    if not examples:
        raise InvalidInput("--python needs --example INPUT=FILE.npy for each input: the model is run once on them "
                           "to learn what it takes and returns")
    # links are kept as links (pack refuses one that leaves the directory), not followed out of it
    shutil.copytree(path.parent, work / "model", symlinks=True, ignore=shutil.ignore_patterns("__pycache__", ".*"))
    inputs = {}
    for input_name, file in examples.items():
        try:
            inputs[input_name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InvalidInput(f"--example {input_name}={file}: not a .npy file numpy reads: {e}", subject=str(file)) \
                from None
    with tempfile.TemporaryDirectory(prefix="cartonstore-pack-run-") as out:
        done = subprocess.run([sys.executable, "-c", _RUN, str(work), path.stem, fn, out,
                               json.dumps({k: str(v) for k, v in examples.items()})],
                              capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()[-12:]
            raise InvalidInput(f"--python {entry}: the model failed on the examples:\n" +
                               "\n".join(f"  {line}" for line in lines), details={"stderr": lines})
        names = json.loads((Path(out) / "names.json").read_text())
        outputs = {n: np.load(Path(out) / f"{i}.npy", allow_pickle=False) for i, n in enumerate(names)}
    batched = _batched([*inputs.values(), *outputs.values()])
    toml: dict[str, Any] = {
        "spec_version": 1, "model_name": name or path.stem,
        "input": [_declaration(n, a, batched) for n, a in inputs.items()],   # an input and an output may share a name
        "output": [_declaration(n, a, batched) for n, a in outputs.items()],
        "self_test": [{"name": "recorded", "description": "the model's answer when it was packed",
                       "inputs": {n: f"@tensor_data/in_{n}" for n in inputs},
                       "expected_out": {n: f"@tensor_data/out_{n}" for n in outputs}}],
        "runner": {"runner_name": "python",
                   "required_framework_version": f">={sys.version_info.major}.{sys.version_info.minor}",
                   "runner_compat_version": 1, "opts": {"entrypoint_package": path.stem, "entrypoint_fn": fn}},
    }
    write_tensors(work / "tensor_data", {**{f"in_{k}": v for k, v in inputs.items()},
                                          **{f"out_{k}": v for k, v in outputs.items()}})
    (work / "carton.toml").write_text(tomli_w.dumps(toml))
    return work
