"""The built-in `python` runner, with Carton's python runner semantics.

[runner.opts] entrypoint_package and entrypoint_fn name a module inside the
carton's model/ directory and a function in it; the function is called
with no arguments and returns the model. The model implements
`infer_with_tensors(tensors: dict[str, np.ndarray]) -> dict[str, array]`,
or `seal(tensors) -> handle` and `infer_with_handle(handle) -> dict`. A
decoupled model (many responses to one request, Triton's decoupled
transaction policy) has `infer_stream_with_tensors(tensors)`, a generator
of such dicts: the carton declares itself decoupled so, and a plain infer
of it is refused.
String tensors reach the model as object arrays of str (Carton strings are
UTF-8; a BYTES element that is not stays bytes) and may come back as str,
bytes or object arrays. model/requirements.txt must be met by the runner's
own environment (nothing is installed).

Run as: python -m cartonstore.runner.backends.python --model-dir ... --socket ...
"""

from __future__ import annotations

import importlib
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from cartonstore.runner.context import LoadError, RunnerContext
from cartonstore.runner.serving import main

from .requirements import check_requirements_file


class CartonPythonModel:
    """A Carton python model behind the runner SDK's infer()."""

    def __init__(self, model: Any) -> None:
        self._model = model
        if callable(getattr(model, "infer_stream_with_tensors", None)):
            return   # decoupled: CartonPythonStreamModel
        self._infer_with_tensors: Callable[..., Any] | None = getattr(model, "infer_with_tensors", None)
        self._seal: Callable[..., Any] | None = getattr(model, "seal", None)
        self._infer_with_handle: Callable[..., Any] | None = getattr(model, "infer_with_handle", None)
        if not callable(self._infer_with_tensors) and not (
            callable(self._seal) and callable(self._infer_with_handle)
        ):
            raise LoadError(
                f"the model object ({type(model).__name__}) must have infer_with_tensors(tensors), "
                "or seal(tensors) and infer_with_handle(handle)"
            )
        # seal + infer_with_handle are two calls that belong together.
        self._seal_lock = threading.Lock()

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> Any:
        tensors = {name: _strings_for_model(array) for name, array in inputs.items()}
        if callable(self._infer_with_tensors):
            return self._infer_with_tensors(tensors)
        with self._seal_lock:
            handle = self._seal(tensors)  # type: ignore[misc]  # no infer_with_tensors: the seal pair is callable
            return self._infer_with_handle(handle)  # type: ignore[misc]  # no infer_with_tensors: the seal pair is callable


class CartonPythonStreamModel(CartonPythonModel):
    """A decoupled Carton python model behind the runner SDK's infer_stream()."""

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> Any:
        raise ValueError("this model is decoupled: it answers a stream of responses (infer_stream), not one")

    def infer_stream(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> Iterator[Any]:
        tensors = {name: _strings_for_model(array) for name, array in inputs.items()}
        return iter(self._model.infer_stream_with_tensors(tensors))


def _strings_for_model(array: np.ndarray) -> np.ndarray:
    if array.dtype != object:
        return array
    try:
        decoded = [element.decode("utf-8") for element in array.reshape(-1).tolist()]
    except (UnicodeDecodeError, AttributeError):
        return array
    out = np.empty(len(decoded), dtype=object)
    out[:] = decoded
    return out.reshape(array.shape)


def _entrypoint(ctx: RunnerContext) -> tuple[str, str]:
    names = []
    for key in ("entrypoint_package", "entrypoint_fn"):
        value = ctx.opts.get(key)
        if not isinstance(value, str) or not value:
            state = "is not set" if value is None else f"is {value!r}, not a non-empty string"
            raise LoadError(
                f"runner option {key} {state}; a python carton names its entrypoint with "
                "[runner.opts] entrypoint_package and entrypoint_fn"
            )
        names.append(value)
    return names[0], names[1]


def check_requirements(ctx: RunnerContext) -> None:
    path = ctx.model_files / "requirements.txt"
    try:
        unmet = check_requirements_file(path)
    except (ValueError, OSError) as exc:
        raise LoadError(f"model/requirements.txt: {exc}") from None
    if unmet:
        listed = "; ".join(u.describe() for u in unmet)
        raise LoadError(
            f"model/requirements.txt is not met by the runner's python ({sys.executable}): {listed}"
        )


def load(ctx: RunnerContext) -> CartonPythonModel:
    package, fn_name = _entrypoint(ctx)
    root = ctx.model_files
    if not root.is_dir():
        raise LoadError(f"the carton has no model/ directory ({root})")
    check_requirements(ctx)
    sys.path.insert(0, str(root.resolve()))
    try:
        module = importlib.import_module(package)
    except Exception as exc:  # noqa: BLE001 - the model's own import errors are the reason
        traceback.print_exc(file=sys.stderr)
        raise LoadError(f"cannot import entrypoint_package {package!r}: {type(exc).__name__}: {exc}") from None
    entrypoint = getattr(module, fn_name, None)
    if not callable(entrypoint):
        raise LoadError(f"entrypoint_package {package!r} has no function {fn_name!r} (entrypoint_fn)")
    try:
        model = entrypoint()
    except Exception as exc:  # noqa: BLE001 - the model's own constructor: whatever it raises is the reason
        traceback.print_exc(file=sys.stderr)
        raise LoadError(f"{package}.{fn_name}() raised {type(exc).__name__}: {exc}") from None
    if callable(getattr(model, "infer_stream_with_tensors", None)):
        return CartonPythonStreamModel(model)
    return CartonPythonModel(model)


if __name__ == "__main__":
    main(load)
