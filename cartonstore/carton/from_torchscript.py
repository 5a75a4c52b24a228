"""A carton made from a TorchScript file: `cartonstore pack model.pt
--example x=x.npy -o m.carton`.

A TorchScript file says its forward's argument names but not the dtypes
or shapes it takes, nor what it returns; so, as for a python model, the
model is run once on the example inputs through the torchscript runner's
own loading (forward's schema checked against the examples' names, as at
every load), in a child process, on the CPU. carton.toml records the run:
each input and output with the dtype and shape it had, a shared "batch"
first dimension when every tensor has one of the same size, and the run
as a [[self_test]]. Outputs are named as the runner names them: a dict's
keys, else output0, output1, ... in the order forward returns them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .example_run import declarations, recorded_self_test, run_on_examples
from .from_model import place_file

# what TorchScript files saved by torch 2.x need; one saved by a newer torch
# that uses operators an older one lacks is refused by torch.jit.load, by name
TORCH_FRAMEWORK = ">=2.0"


def torchscript_carton_dir(model: Path, work: Path, *, name: str | None, examples: Mapping[str, Path]) -> Path:
    """An unpacked carton in ``work`` (made here) for the TorchScript file ``model``."""
    import tomli_w

    (work / "model").mkdir(parents=True)
    place_file(model, work / "model" / "model.pt")
    inputs, outputs = run_on_examples("torchscript", work, {}, examples, str(model))
    toml: dict[str, Any] = {
        "spec_version": 1, "model_name": name or model.stem, **declarations(inputs, outputs),
        "self_test": [recorded_self_test(work / "tensor_data", inputs, outputs)],
        "runner": {"runner_name": "torchscript", "required_framework_version": TORCH_FRAMEWORK,
                   "runner_compat_version": 1},
    }
    (work / "carton.toml").write_text(tomli_w.dumps(toml))
    return work
