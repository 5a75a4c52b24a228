"""Triton's model configuration extension: the config a load may give
(what cartonstore honours, the rest refused by name) and the config
GET /v2/models/{name}/config answers, made from carton.toml and that
load's config. A load's config arrives parsed as Triton parses it
(load_params.py: protobuf's ModelConfig, so every field has its type, and
only fields set are present); the rules here are cartonstore's own.

Honoured: max_batch_size, dynamic_batching (batcher.py), instance_group,
parameters (the runner's opts), response_cache (response_cache.py),
sequence_batching (sequence_config.py, sequences.py); name,
platform, backend, input and output are accepted when they say what the
carton says, and model_transaction_policy (decoupled: whether the model
streams many responses to one request is its runner's to say, from the
carton's model: a python model with infer_stream_with_tensors, an SDK
model with infer_stream; the config read back says it, and a load saying
decoupled of a runner that does not stream fails, schedulers.py). Everything else Triton's
ModelConfig has (ensembles, warmup, ...) is refused,
naming the field, rather than accepted and ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import CartonConfig, TensorSpec
from cartonstore.format.dtypes import carton_dtype_to_v2, shape_to_v2_dims
from cartonstore.runner.builtin_runners import triton_platform

from .sequence_config import sequence_policy

log = logging.getLogger(__name__)

MAX_BATCH_LIMIT = 1 << 20
HONOURED = ("max_batch_size", "dynamic_batching", "sequence_batching", "instance_group", "parameters",
            "response_cache")
CHECKED = ("name", "platform", "backend", "input", "output", "version_policy", "runtime", "model_transaction_policy")
# what config_of answers beside these, so a config read back loads again unchanged
_ONE_VERSION = {"latest": {"num_versions": 1}}
# messages that mean nothing when present and empty (a config read back from Triton writes them so)
_TENSOR_EMPTY = ("reshape",)
_GROUP_FIELDS = ("name", "kind", "count", "gpus")
_GROUP_EMPTY = ("rate_limiter",)


def check_config_fields(config: Mapping[str, Any] | None) -> None:
    """Refuse, by name, every field of a load's config that cartonstore
    does not honour (before any work)."""
    if not config:
        return
    asks_response_cache(config)
    unknown = sorted(set(config) - set(HONOURED) - set(CHECKED))
    if unknown:
        raise InvalidInput(f"config: cartonstore does not support {', '.join(repr(k) for k in unknown)} "
                           f"(it honours {', '.join(HONOURED)}; {', '.join(CHECKED)} must match the carton)",
                           subject=unknown[0])
    batch = config.get("max_batch_size", 0)
    if not 0 <= batch <= MAX_BATCH_LIMIT:
        raise InvalidInput(f"config: 'max_batch_size' must be an integer in [0, {MAX_BATCH_LIMIT}], not {batch!r}",
                           subject="max_batch_size")
    if config.get("version_policy") not in (None, {}, _ONE_VERSION):
        raise InvalidInput(f"config: cartonstore serves one version of a model (its manifest hash): "
                           f"'version_policy' {config['version_policy']!r} is not supported", subject="version_policy")
    for i, group in enumerate(config.get("instance_group", ())):
        _unsupported_fields(group, _GROUP_FIELDS, _GROUP_EMPTY, f"instance_group[{i}]")
    sequence_policy(config, None)


def asks_response_cache(config: Mapping[str, Any] | None) -> bool:
    """Whether a load's config enables the response cache; refuses, by
    name, a response_cache field cartonstore does not know, the cache for
    a decoupled model (as Triton refuses it: a decoupled model's many
    responses are no one answer to keep)."""
    config = config or {}
    cache = config.get("response_cache", {})
    _unsupported_fields(cache, ("enable",), (), "response_cache")
    enabled = bool(cache.get("enable", False))
    if enabled and (config.get("model_transaction_policy") or {}).get("decoupled", False):
        raise InvalidInput("config: the response cache does not support a model with the 'decoupled' "
                           "transaction policy (model_transaction_policy); disable response_cache",
                           subject="response_cache")
    _unsupported_fields(config.get("model_transaction_policy", {}), ("decoupled",), (), "model_transaction_policy")
    return enabled


def caches_answers(name: str, config: Mapping[str, Any] | None, cache_size: int) -> bool:
    """Whether the model's answers go in the response cache: its config
    asks and the daemon has one. A model asking while [cache] size is 0
    loads without it, with a warning (as Triton loads it)."""
    if not asks_response_cache(config):
        return False
    if not cache_size:
        log.warning("model %s: its config enables response_cache, but [cache] size is 0: its answers are "
                    "not cached", name)
        return False
    return True


MAX_QUEUE_DELAY_US = 10_000_000   # ten seconds: a longer wait is a mistake, not a policy
_BATCHING_FIELDS = ("preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering")
_BATCHING_EMPTY = ("default_queue_policy",)


@dataclass(frozen=True)
class BatchingPolicy:
    """A load's dynamic_batching: requests joined up to max_batch_size rows,
    a batch of a preferred size sent at once, any other after the oldest
    request has waited max_queue_delay."""

    max_batch_size: int
    max_queue_delay_us: int = 0
    preferred: tuple[int, ...] = ()

    def as_config(self) -> dict[str, Any]:
        return {"preferred_batch_size": list(self.preferred), "max_queue_delay_microseconds": self.max_queue_delay_us}


def batching_policy(carton: CartonConfig, config: Mapping[str, Any] | None) -> BatchingPolicy | None:
    """The load's dynamic_batching checked (InvalidInput naming what is
    wrong), or None when it asks for none."""
    given = (config or {}).get("dynamic_batching")
    if given is None:
        return None
    _unsupported_fields(given, _BATCHING_FIELDS, _BATCHING_EMPTY, "dynamic_batching")
    batch = max_batch_size(carton, config)
    if not batch:
        raise InvalidInput("config: dynamic_batching joins requests along their first dimension, so it needs "
                           "max_batch_size > 0", subject="dynamic_batching")
    delay = given.get("max_queue_delay_microseconds", 0)
    if not 0 <= delay <= MAX_QUEUE_DELAY_US:
        raise InvalidInput(f"config: dynamic_batching: 'max_queue_delay_microseconds' must be an integer in "
                           f"[0, {MAX_QUEUE_DELAY_US}], not {delay!r}", subject="max_queue_delay_microseconds")
    sizes = given.get("preferred_batch_size", [])
    if any(not 1 <= size <= batch for size in sizes):
        raise InvalidInput(f"config: dynamic_batching: 'preferred_batch_size' must be a list of sizes in "
                           f"[1, max_batch_size {batch}], not {sizes!r}", subject="preferred_batch_size")
    return BatchingPolicy(batch, delay, tuple(sorted(set(sizes))))


def _unsupported_fields(entry: Mapping[str, Any], known: Sequence[str], empty: Sequence[str], where: str) -> None:
    """Refuse a field cartonstore would ignore: one it does not know, or
    one it knows only when empty, set otherwise."""
    for key, value in entry.items():
        if key in known:
            continue
        if key not in empty or value != {}:
            raise InvalidInput(f"config: {where}: cartonstore does not support {key!r} = {value!r}", subject=key)


JSON_ELEMENT = 32            # the most one element of a numeric output takes in a JSON answer, separator included
ANSWER_HEAD_ROOM = 64 << 10  # an answer's JSON header beside its outputs' data


def answer_limit(outputs: Sequence[TensorSpec] | None, configured: int | None, max_request_size: int) -> int:
    """The most bytes one infer answer of a model may have:
    runners.max_response_size when set, else the larger of max_request_size
    and what the model's declared outputs can hold (every element at its
    widest in JSON, as binary is narrower). Outputs of any size (a symbolic
    dimension, BYTES) hold no more than max_request_size."""
    if configured is not None:
        return configured
    return max(max_request_size, _declared_bound(outputs))


def _declared_bound(outputs: Sequence[TensorSpec] | None) -> int:
    total = ANSWER_HEAD_ROOM
    for spec in outputs or ():
        shape, dtype = spec.shape, carton_dtype_to_v2(spec.dtype)
        if dtype == "BYTES" or not isinstance(shape, tuple):
            return 0
        sizes = [d for d in shape if type(d) is int]
        if len(sizes) != len(shape):   # a named (variable) dimension: no bound
            return 0
        total += prod(sizes) * JSON_ELEMENT
    return total


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
    platform, backend = triton_platform(carton.runner.runner_name)
    for key, ours in (("platform", platform), ("backend", backend), ("runtime", carton.runner.runner_name)):
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


def _check_tensors(key: str, given: list[dict[str, Any]], specs: Sequence[TensorSpec], batch: int) -> None:
    declared = {s.name: s for s in specs}
    for entry in given:
        named = entry.get("name")
        spec = declared.get(named) if isinstance(named, str) else None
        if spec is None:
            raise InvalidInput(f"config: {key} {entry.get('name')!r} is not one the carton declares "
                               f"({', '.join(declared) or 'none'})", subject=key)
        _unsupported_fields(entry, ("name", "data_type", "dims"), _TENSOR_EMPTY, f"{key} {spec.name!r}")
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
                 devices: Sequence[str], decoupled: bool = False) -> dict[str, Any]:
    """Triton's ModelConfig JSON for a loaded version running on ``devices``
    (one per instance); ``decoupled``: its runners stream responses."""
    platform, backend = triton_platform(carton.runner.runner_name)
    batch = max_batch_size(carton, config)
    groups: list[dict[str, Any]] = []
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
            "runtime": carton.runner.runner_name,
            **({"model_transaction_policy": {"decoupled": True}} if decoupled else {}),
            **({"dynamic_batching": policy.as_config()} if (policy := batching_policy(carton, config)) else {}),
            **({"response_cache": {"enable": True}} if asks_response_cache(config) else {}),
            **({"sequence_batching": seq.as_config()} if (seq := sequence_policy(config, carton.inputs)) else {})}
