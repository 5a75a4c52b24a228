"""What a runner is given (RunnerContext), what it must give back (a Model),
and the one error a loader raises to refuse a model (LoadError)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from cartonstore.format.carton_toml import TensorSpec


class LoadError(Exception):
    """The model cannot be loaded; the message is the one line the daemon
    shows as the reason (the runner exits with status 3)."""


@dataclass
class RunnerContext:
    """Everything a runner knows about the model it serves.

    ``model_dir`` is the unpacked carton (carton.toml, model/, ...);
    ``opts`` is the carton's [runner.opts] overridden by the load's options;
    ``devices`` lists "cpu" or "cuda:N" (N as the daemon numbers GPUs, see
    cuda_ordinal). ``inputs``/``outputs`` come from carton.toml and are None
    when it declares none.
    """

    model_dir: Path
    socket_path: Path
    opts: dict[str, Any]
    devices: list[str]
    name: str
    version: str
    inputs: list[TensorSpec] | None = None
    outputs: list[TensorSpec] | None = None
    runner_name: str | None = None

    @cached_property
    def declared_outputs(self) -> dict[str, TensorSpec] | None:
        """carton.toml's outputs by name (None: it declares none), what every
        answer is checked against."""
        return {spec.name: spec for spec in self.outputs} if self.outputs is not None else None

    @property
    def model_files(self) -> Path:
        """The carton's model/ directory."""
        return self.model_dir / "model"

    def cuda_device(self) -> str | None:
        """The first "cuda:N" in devices, or None when only the CPU is given."""
        for device in self.devices:
            if device.startswith("cuda"):
                return device
        return None

    def opt_int(self, key: str, default: int | None = None, *, minimum: int = 0) -> int | None:
        """An integer option, or ``default``; LoadError for anything else."""
        value = self.opts.get(key, default)
        if value is None:
            return None
        if type(value) is str and value.strip().isdigit():  # Triton's load-time string_value parameters
            value = int(value)
        if type(value) is not int or value < minimum:
            raise LoadError(f"runner option {key!r} must be an integer >= {minimum}, not {value!r}")
        return value

    def opt_bool(self, key: str, default: bool) -> bool:
        """A boolean option (Triton's string parameters "true"/"false" too),
        or ``default``; LoadError for anything else."""
        value = self.opts.get(key, default)
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            value = value.strip().lower() == "true"
        if not isinstance(value, bool):
            raise LoadError(f"runner option {key!r} must be true or false, not {value!r}")
        return value

    def opt_str(self, key: str, default: str | None = None) -> str | None:
        value = self.opts.get(key, default)
        if value is not None and (not isinstance(value, str) or not value):
            raise LoadError(f"runner option {key!r} must be a non-empty string, not {value!r}")
        return value

    def model_file(self, default: str) -> Path:
        """opts["model_file"] (or ``default``) resolved inside model/; it must
        exist and may not leave model/ (the option comes from the carton)."""
        relative = self.opt_str("model_file", default)
        assert relative is not None
        root = self.model_files.resolve()
        path = (root / relative).resolve()
        if path != root and root not in path.parents:
            raise LoadError(f"runner option model_file {relative!r} points outside the carton's model/ directory")
        if not path.is_file():
            raise LoadError(f"model file model/{relative} does not exist in {self.model_dir}")
        return path


def cuda_ordinal(device: str) -> int:
    """The index a CUDA library in this process must use for ``device``.

    The daemon gives a runner on "cuda:N" CUDA_VISIBLE_DEVICES=N, so inside
    the runner that GPU is number 0: the ordinal is N's place in
    CUDA_VISIBLE_DEVICES when it is set, else N itself.
    """
    number = device.partition(":")[2] or "0"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return int(number)
    listed = [entry.strip() for entry in visible.split(",")]
    if number in listed:
        return listed.index(number)
    # Listed by UUID or otherwise unmatched: one visible GPU is ours.
    return 0 if len(listed) == 1 else int(number)


@dataclass
class InferResult:
    """What Model.infer may return instead of a plain dict, to add response
    "parameters" (passed through to the client)."""

    outputs: dict[str, Any]
    parameters: dict[str, Any] = field(default_factory=dict)


InferOutput = Mapping[str, Any] | InferResult


@runtime_checkable
class Model(Protocol):
    """A loaded model. ``infer`` runs in the thread that read the request
    (one call at a time unless opts max_concurrency says more; not always
    the same thread: keep no per-thread state between calls); it returns arrays (or
    anything np.asarray takes) by output name. str/bytes/object arrays are
    sent as BYTES.

    A decoupled model (many responses to one request, as Triton's decoupled
    models) also has ``infer_stream(inputs, parameters)``: an iterator of
    such answers, each sent as one response as soon as it is yielded (the
    next is asked for once the reader has taken it); the runner lists
    itself decoupled and the daemon sends its stream requests there."""

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> InferOutput: ...
