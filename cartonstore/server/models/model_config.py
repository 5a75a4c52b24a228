"""Triton's model configuration extension: the config a load may give
(what cartonstore honours, the rest refused by name) and the config
GET /v2/models/{name}/config answers, made from carton.toml and that
load's config.

Honoured: max_batch_size, instance_group, parameters (the runner's opts);
name, platform, backend, input and output are accepted when they say what
the carton says. Everything else Triton's ModelConfig has (dynamic
batching, ensembles, warmup, ...) is refused, naming the field, rather
than accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import CartonConfig, TensorSpec
from cartonstore.format.dtypes import carton_dtype_to_v2, shape_to_v2_dims

MAX_BATCH_LIMIT = 1 << 20
HONOURED = ("max_batch_size", "instance_group", "parameters")
CHECKED = ("name", "platform", "backend", "input", "output")
# Triton's names for what the built-in runners run (model_config.proto's platform and backend)
_PLATFORMS = {"onnx": ("onnxruntime_onnx", "onnxruntime"), "torchscript": ("pytorch_libtorch", "pytorch"),
              "python": ("", "python")}


def platform_of(runner_name: str) -> tuple[str, str]:
    """(platform, backend) as Triton names them; other runners: carton_<name>."""
    return _PLATFORMS.get(runner_name, (f"carton_{runner_name}", f"carton_{runner_name}"))


def check_config_fields(config: Mapping[str, Any] | None) -> None:
    """Refuse, by name, every field of a load's config that cartonstore
    does not honour (before any work)."""
    if not config:
        return
    unknown = sorted(set(config) - set(HONOURED) - set(CHECKED))
    if unknown:
        raise InvalidInput(f"config: cartonstore does not support {', '.join(repr(k) for k in unknown)} "
                           f"(it honours {', '.join(HONOURED)}; {', '.join(CHECKED)} must match the carton)",
                           subject=unknown[0])
    batch = config.get("max_batch_size", 0)
    if isinstance(batch, bool) or not isinstance(batch, int) or not 0 <= batch <= MAX_BATCH_LIMIT:
        raise InvalidInput(f"config: 'max_batch_size' must be an integer in [0, {MAX_BATCH_LIMIT}], not {batch!r}",
                           subject="max_batch_size")


def max_batch_size(carton: CartonConfig, config: Mapping[str, Any] | None) -> int:
    """The load's max_batch_size, else the carton's [runner.opts] one, else 0."""
    if config and "max_batch_size" in config:
        return config["max_batch_size"]
    value = carton.runner.opts.get("max_batch_size", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def check_against_carton(name: str, carton: CartonConfig, config: Mapping[str, Any] | None) -> None:
    """What a load's config says of the model must be what its carton says."""
    if not config:
        return
    if "name" in config and config["name"] != name:
        raise InvalidInput(f"config: 'name' is {config['name']!r}, but the model is loaded as {name!r}",
                           subject="name")
    platform, backend = platform_of(carton.runner.runner_name)
    for key, ours in (("platform", platform), ("backend", backend)):
        if config.get(key) not in (None, "", ours):
            raise InvalidInput(f"config: {key!r} is {config[key]!r}, but the carton's runner "
                               f"{carton.runner.runner_name!r} is {ours!r}", subject=key)
    batch = max_batch_size(carton, config)
    for key, specs in (("input", carton.inputs), ("output", carton.outputs)):
        if key in config:
            _check_tensors(key, config[key], specs or (), batch)
    if batch:
        for spec in (*(carton.inputs or ()), *(carton.outputs or ())):
            if isinstance(spec.shape, tuple) and (not spec.shape or isinstance(spec.shape[0], int)):
                raise InvalidInput(f"config: max_batch_size {batch} needs a variable first (batch) dimension, "
                                   f"but {spec.name!r} has shape {list(spec.shape)}", subject="max_batch_size")


def _check_tensors(key: str, given: Any, specs: Sequence[TensorSpec], batch: int) -> None:
    if not isinstance(given, list) or not all(isinstance(t, dict) for t in given):
        raise InvalidInput(f"config: {key!r} must be a list of objects", subject=key)
    declared = {s.name: s for s in specs}
    for entry in given:
        spec = declared.get(entry.get("name"))
        if spec is None:
            raise InvalidInput(f"config: {key} {entry.get('name')!r} is not one the carton declares "
                               f"({', '.join(declared) or 'none'})", subject=key)
        ours = tensor_config(spec, batch)
        for field_name in ("data_type", "dims"):
            if field_name in entry and entry[field_name] != ours[field_name]:
                raise InvalidInput(f"config: {key} {spec.name!r} {field_name} is {entry[field_name]!r}, but the "
                                   f"carton declares {ours[field_name]!r}", subject=key)


def triton_data_type(carton_dtype: str) -> str:
    v2 = carton_dtype_to_v2(carton_dtype)
    return "TYPE_STRING" if v2 == "BYTES" else f"TYPE_{v2}"


def tensor_config(spec: TensorSpec, batch: int) -> dict[str, Any]:
    dims = shape_to_v2_dims(spec.shape)
    batched = batch and isinstance(spec.shape, tuple)   # "any shape" stays [-1]
    return {"name": spec.name, "data_type": triton_data_type(spec.dtype), "dims": dims[1:] if batched else dims}


def model_config(name: str, carton: CartonConfig, config: Mapping[str, Any] | None,
                 devices: Sequence[str]) -> dict[str, Any]:
    """Triton's ModelConfig JSON for a loaded version running on ``devices``
    (one per instance)."""
    platform, backend = platform_of(carton.runner.runner_name)
    batch = max_batch_size(carton, config)
    groups = []
    for device in dict.fromkeys(devices):
        count = sum(1 for d in devices if d == device)
        gpu = device.startswith("cuda:")
        groups.append({"name": f"{name}_{len(groups)}", "kind": "KIND_GPU" if gpu else "KIND_CPU", "count": count,
                       "gpus": [int(device.split(":")[1])] if gpu else []})
    params = {key: {"string_value": str(value).lower() if isinstance(value, bool) else str(value)}
              for key, value in carton.runner.opts.items()}
    for key, value in ((config or {}).get("parameters") or {}).items():
        params[key] = value if isinstance(value, dict) else {"string_value": str(value)}
    return {"name": name, "platform": platform, "backend": backend,
            "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": batch,
            "input": [tensor_config(s, batch) for s in carton.inputs or ()],
            "output": [tensor_config(s, batch) for s in carton.outputs or ()],
            "instance_group": groups, "parameters": params,
            "runtime": carton.runner.runner_name}
