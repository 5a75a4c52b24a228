"""The built-in `onnx` runner: an onnxruntime InferenceSession.

The model is model/model.onnx, or the file [runner.opts] model_file names
(relative to model/). Carton input names are the ONNX graph's input names;
the graph is checked against carton.toml at load (declared.py) and only
the declared outputs are computed.
On a "cuda:N" device the CUDA execution provider is used, and the load
fails naming why when this onnxruntime has none or cannot start it. Opts intra_op_num_threads and
inter_op_num_threads size onnxruntime's thread pools; ``prepacking = false``
loads faster and runs mid-sized batches slower (see load()).

Run as: python -m cartonstore.runner.backends.onnx --model-dir ... --socket ...
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from cartonstore.runner.context import LoadError, RunnerContext, cuda_ordinal
from cartonstore.runner.declared import graph_problems
from cartonstore.runner.serving import main


def _providers(ort: Any, ctx: RunnerContext) -> list[Any]:
    device = ctx.cuda_device()
    if device is None:
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise LoadError(f"the model is placed on {device}, but this onnxruntime ({ort.__version__}) has no "
                        f"CUDAExecutionProvider (its providers: {', '.join(ort.get_available_providers())}; "
                        "install onnxruntime-gpu)")
    # CPU as the second provider runs the nodes CUDA has no kernel for, as onnxruntime does on GPUs
    return [("CUDAExecutionProvider", {"device_id": cuda_ordinal(device)}), "CPUExecutionProvider"]


def _check_placed(session: Any, ctx: RunnerContext) -> None:
    """onnxruntime falls back to the CPU, with a warning only, when its CUDA
    provider cannot start (no driver, no usable GPU, a missing cuDNN): a model
    the daemon says is on cuda:N must not run on the CPU unsaid."""
    device = ctx.cuda_device()
    if device is not None and "CUDAExecutionProvider" not in session.get_providers():
        raise LoadError(f"the model is placed on {device}, but onnxruntime could not start its CUDA provider "
                        f"(the session's providers: {', '.join(session.get_providers())}; "
                        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")


class OnnxModel:
    def __init__(self, session: Any, declared_outputs: list[str] | None = None) -> None:
        self._session = session
        # the declared outputs only (checked against the graph at load): a graph's other
        # outputs are neither computed nor sent, as the model's metadata does not announce them
        self._output_names = declared_outputs or [o.name for o in session.get_outputs()]
        # ONNX string tensors are numpy arrays of str; BYTES arrive as bytes.
        self._string_inputs = {i.name for i in session.get_inputs() if i.type == "tensor(string)"}

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, np.ndarray]:
        feed = {
            name: _as_strings(array) if name in self._string_inputs else array
            for name, array in inputs.items()
        }
        results = self._session.run(self._output_names, feed)
        return dict(zip(self._output_names, results, strict=True))


def _as_strings(array: np.ndarray) -> np.ndarray:
    if array.dtype != object:
        return array
    flat = [e.decode("utf-8") if isinstance(e, bytes) else e for e in array.reshape(-1).tolist()]
    return np.array(flat, dtype=object).reshape(array.shape)


def load(ctx: RunnerContext) -> OnnxModel:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise LoadError(f"onnxruntime is not installed in the runner's python ({sys.executable}): {exc}") from None
    path = ctx.model_file("model.onnx")
    options = ort.SessionOptions()
    intra = ctx.opt_int("intra_op_num_threads")
    inter = ctx.opt_int("inter_op_num_threads")
    if intra is not None:
        options.intra_op_num_threads = intra
    if inter is not None:
        options.inter_op_num_threads = inter
    if not ctx.opt_bool("prepacking", True):
        # Prepacking reorders every constant GEMM weight for MLAS at load. A 256 MiB chain of
        # MatMuls (2 cores): session 0.49 s with it, 0.19 s without; batch 16 then ran in
        # 31.6 ms instead of 16.5, batch 1 in 13.9 ms instead of 11.0, batch 256 alike.
        options.add_session_config_entry("session.disable_prepacking", "1")
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=_providers(ort, ctx))
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise LoadError(f"onnxruntime cannot load {path.name}: {type(exc).__name__}: {exc}") from None
    _check_placed(session, ctx)
    problems = graph_problems([(i.name, i.type, i.shape) for i in session.get_inputs()],
                              [(o.name, o.type, o.shape) for o in session.get_outputs()], ctx.inputs, ctx.outputs,
                              [(i.name, i.type, i.shape) for i in session.get_overridable_initializers()])
    if problems:
        raise LoadError(f"{path.name} does not match carton.toml: " + "; ".join(problems))
    return OnnxModel(session, [s.name for s in ctx.outputs] if ctx.outputs else None)


def warm(devices: list[str]) -> None:
    """What a runner started before its model does while it waits: onnxruntime's import."""
    import onnxruntime  # noqa: F401 - imported to be warm, not used here


if __name__ == "__main__":
    main(load, warm=warm)
