"""The built-in `torchscript` runner: torch.jit.load and call the module.

The model is model/model.pt, or the file [runner.opts] model_file names
(relative to model/). As in Carton, forward takes one Dict[str, Tensor];
a forward with other arguments gets the inputs as keyword arguments by
name. Outputs: a dict by name; a tuple (or a list of tensors) mapped onto
the carton's outputs in order; a single tensor as the one output. String
inputs become str (0-d) or List[str] (1-d), and str / List[str] outputs
come back as BYTES. Opts num_threads and num_interop_threads size torch's
thread pools. On "cuda:N" the model runs on that GPU, and the load fails
naming why when torch cannot use it; inputs reach it through reused pinned
buffers (torch_staging.py; opt pinned_staging = false: pageable copies).
BF16 tensors cross as their bit patterns, exactly.
At load, forward's schema is checked against carton.toml (declared.py):
argument names and kinds, and how many values it returns.

Run as: python -m cartonstore.runner.backends.torchscript --model-dir ... --socket ...
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from cartonstore.format.carton_toml import TensorSpec
from cartonstore.runner.context import LoadError, RunnerContext, cuda_ordinal
from cartonstore.runner.declared import forward_problems, takes_input_dict
from cartonstore.runner.serving import main

from .torch_staging import TensorStaging


def _device(torch: Any, ctx: RunnerContext) -> str:
    """The torch device for the load's device; LoadError when it is a GPU
    torch cannot use (never a silent fall back to the CPU while the daemon
    says cuda:N)."""
    device = ctx.cuda_device()
    if device is None:
        return "cpu"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not torch.cuda.is_available():
        why = ("this torch is built without CUDA" if torch.version.cuda is None
               else f"torch (CUDA {torch.version.cuda}) finds no usable GPU; CUDA_VISIBLE_DEVICES={visible!r}")
        raise LoadError(f"the model is placed on {device}, but {why} (torch {torch.__version__})")
    ordinal = cuda_ordinal(device)
    if ordinal >= torch.cuda.device_count():
        raise LoadError(f"the model is placed on {device}, but torch sees {torch.cuda.device_count()} GPU(s) "
                        f"(CUDA_VISIBLE_DEVICES={visible!r})")
    return f"cuda:{ordinal}"


# forward's arguments (name, type, has_default) and return type, as TorchScript prints them
Schema = tuple[list[tuple[str, str, bool]], str]


def _schema(module: Any) -> Schema | None:
    """forward's arguments (name, type, has_default; self left out) and
    return type as TorchScript prints them; None when it has no schema."""
    try:
        schema = module.forward.schema
    except AttributeError:
        return None
    arguments = [(a.name, str(a.type), a.has_default_value()) for a in schema.arguments if a.name != "self"]
    types = [str(r.type) for r in schema.returns]
    return arguments, types[0] if len(types) == 1 else f"Tuple[{', '.join(types)}]"


def _caller(module: Any, schema: Schema | None) -> Callable[[dict[str, Any]], Any]:
    """How to pass the inputs to forward: one dict (Carton's convention)
    or keyword arguments named like the inputs."""
    if schema is None or takes_input_dict(schema[0]):
        return lambda tensors: module(tensors)
    return lambda tensors: module(**tensors)


class TorchScriptModel:
    def __init__(self, torch: Any, module: Any, staging: TensorStaging, outputs: list[TensorSpec] | None,
                 schema: Schema | None) -> None:
        self._torch = torch
        self._call = _caller(module, schema)
        self._staging = staging
        self._output_names = [spec.name for spec in outputs] if outputs is not None else None
        self._declared = {spec.name: spec.dtype for spec in outputs or ()}

    def _to_torch(self, name: str, array: np.ndarray) -> Any:
        if array.dtype == object:
            strings = [e.decode("utf-8") if isinstance(e, bytes) else e for e in array.reshape(-1).tolist()]
            if array.ndim == 0:
                return strings[0]
            if array.ndim == 1:
                return strings
            raise ValueError(f"input {name!r}: string tensors must have 0 or 1 dimensions, not {array.ndim}")
        return self._staging.to_device(array, name)

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, Any]:
        tensors = {name: self._to_torch(name, array) for name, array in inputs.items()}
        with self._torch.inference_mode():
            result = self._call(tensors)
        return {name: self._to_numpy(name, value) for name, value in self._name_outputs(result).items()}

    def _names(self, count: int) -> list[str]:
        names = self._output_names or [f"output{i}" for i in range(count)]
        if len(names) != count:
            raise ValueError(f"the model returned {count} outputs but the carton declares {len(names)}: {names}")
        return names

    def _name_outputs(self, result: Any) -> dict[str, Any]:
        if isinstance(result, dict):
            return result
        if isinstance(result, tuple) or (
            isinstance(result, list) and not all(isinstance(item, str) for item in result)
        ):
            return dict(zip(self._names(len(result)), result, strict=True))
        return {self._names(1)[0]: result}

    def _to_numpy(self, name: str, value: Any) -> np.ndarray:
        torch = self._torch
        if isinstance(value, torch.Tensor):
            if value.dtype == torch.bfloat16 and self._declared.get(name) == "float32":
                value = value.float()   # carton format v1 has no bfloat16: such a model declares float32
            return self._staging.to_numpy(value)
        if isinstance(value, str):
            return np.array(value, dtype=object)
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            out = np.empty(len(value), dtype=object)
            out[:] = value
            return out
        raise ValueError(f"output {name!r} is a {type(value).__name__}, not a tensor, str or list of str")


def load(ctx: RunnerContext) -> TorchScriptModel:
    try:
        import torch
    except ImportError as exc:
        raise LoadError(f"torch is not installed in the runner's python ({sys.executable}): {exc}") from None
    path = ctx.model_file("model.pt")
    threads = ctx.opt_int("num_threads", minimum=1)
    interop = ctx.opt_int("num_interop_threads", minimum=1)
    if threads is not None:
        torch.set_num_threads(threads)
    if interop is not None:
        torch.set_num_interop_threads(interop)
    device = _device(torch, ctx)
    try:
        module = torch.jit.load(str(path), map_location=device)
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError and friends
        raise LoadError(f"torch.jit.load cannot load {path.name}: {type(exc).__name__}: {exc}") from None
    module.eval()
    schema = _schema(module)
    problems = forward_problems(*schema, ctx.inputs, ctx.outputs) if schema is not None else []
    if problems:
        raise LoadError(f"{path.name} does not match carton.toml: " + "; ".join(problems))
    staging = TensorStaging(torch, device, pinned=ctx.opt_bool("pinned_staging", True))
    return TorchScriptModel(torch, module, staging, ctx.outputs, schema)


def warm(devices: list[str]) -> None:
    """What a runner started before its model does while it waits: torch's
    import and, for a GPU, its CUDA context (a few hundred ms of a first load)."""
    import torch

    gpus = [d for d in devices if d.startswith("cuda")]
    if gpus and torch.cuda.is_available():
        torch.empty(0, device=f"cuda:{cuda_ordinal(gpus[0])}")


if __name__ == "__main__":
    main(load, warm=warm)
