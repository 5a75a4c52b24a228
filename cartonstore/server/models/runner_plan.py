"""How the daemon runs one loaded carton: which command, checked against
the carton's required framework version, on which devices, how many
instances (Triton's instance_group), with which runner opts.

Decide, then act: plan_runner() and instance_specs() are plain functions
of the carton, the settings and the load request; the service starts the
processes they describe.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cartonstore.config.runners import RunnerSettings
from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import CartonConfig
from cartonstore.format.semver import parse_version, version_satisfies
from cartonstore.server.runner_processes import InstanceSpec, fill_argv, instance_socket_path
from cartonstore.server.runner_processes.sandbox import SandboxPolicy

MAX_INSTANCES = 64


@dataclass(frozen=True)
class RunnerPlan:
    runner_name: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    framework_version: str | None
    builtin: bool = False     # one of cartonstore's own runners (which can start before their model)


def plan_runner(cfg: CartonConfig, settings: RunnerSettings) -> RunnerPlan | None:
    """The command that runs this carton, or None when no runner is
    configured for its runner_name (it then loads as files only). Raises
    InvalidInput when the runner cannot run it (framework version)."""
    name = cfg.runner.runner_name
    custom = settings.commands.get(name)
    if custom is not None:
        plan = RunnerPlan(name, custom.command, custom.env, custom.framework_version)
    elif settings.builtin and name in _builtin_runners():
        plan = RunnerPlan(name, tuple(_builtin_runners()[name]), {}, probe_framework(name), builtin=True)
    else:
        return None
    _check_framework(plan, cfg.runner.required_framework_version)
    return plan


def _builtin_runners() -> Mapping[str, list[str]]:
    from cartonstore.runner.builtin_runners import BUILTIN_RUNNERS

    return BUILTIN_RUNNERS


def probe_framework(runner_name: str) -> str:
    from cartonstore.runner.builtin_runners import FRAMEWORK_VERSION_PROBES

    try:
        return FRAMEWORK_VERSION_PROBES[runner_name]()
    except Exception as e:  # noqa: BLE001 - a missing framework package is the usual cause
        raise InvalidInput(f"the built-in {runner_name} runner cannot run here: {_missing_framework(runner_name, e)}",
                           subject=runner_name) from None


def _missing_framework(runner_name: str, error: Exception) -> str:
    extra = {"onnx": "onnxruntime (pip install 'cartonstore[onnx]')",
             "torchscript": "torch (pip install 'cartonstore[torch]')"}.get(runner_name)
    return f"{extra} is not installed" if extra else f"{type(error).__name__}: {error}"


def _check_framework(plan: RunnerPlan, requirement: str) -> None:
    if plan.framework_version is None or requirement.strip() in ("", "*"):
        return
    try:
        parse_version(plan.framework_version)
    except InvalidInput:
        raise InvalidInput(f"runner {plan.runner_name}: framework_version {plan.framework_version!r} is not a "
                           "version", subject=plan.runner_name) from None
    if not version_satisfies(plan.framework_version, requirement):
        raise InvalidInput(f"the carton requires {plan.runner_name} {requirement}, but the runner provides "
                           f"{plan.framework_version}", subject=plan.runner_name)


# -- instances ------------------------------------------------------------------


def instance_devices(triton_config: Mapping[str, Any] | None, devices: tuple[str, ...]) -> list[str]:
    """One device per instance, from Triton's instance_group (count, kind,
    gpus); 1 instance by default. KIND_CPU instances run on cpu; GPU
    instances on the listed gpus, else the configured devices in turn."""
    groups = (triton_config or {}).get("instance_group") or [{}]
    if not isinstance(groups, list):
        raise InvalidInput("config: 'instance_group' must be a list")
    out: list[str] = []
    for i, group in enumerate(groups):
        if not isinstance(group, dict):
            raise InvalidInput(f"config: instance_group[{i}] must be an object")
        count = group.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_INSTANCES:
            raise InvalidInput(f"config: instance_group[{i}].count must be an integer in [1, {MAX_INSTANCES}], "
                               f"got {count!r}")
        out += _group_devices(i, group, count, devices)
    if len(out) > MAX_INSTANCES:
        raise InvalidInput(f"config: {len(out)} instances asked for; at most {MAX_INSTANCES}")
    return out


def _group_devices(i: int, group: Mapping[str, Any], count: int, devices: tuple[str, ...]) -> list[str]:
    kind = group.get("kind", "KIND_AUTO")
    if kind not in ("KIND_AUTO", "KIND_CPU", "KIND_GPU"):
        raise InvalidInput(f"config: instance_group[{i}].kind {kind!r} is not KIND_AUTO, KIND_CPU or KIND_GPU")
    if kind == "KIND_CPU":
        return ["cpu"] * count
    gpus = group.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, list) or not gpus or \
                not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus):
            raise InvalidInput(f"config: instance_group[{i}].gpus must be a list of GPU numbers")
        pool = [f"cuda:{g}" for g in gpus]
        unknown = [d for d in pool if d not in devices]
        if unknown:
            raise InvalidInput(f"config: instance_group[{i}] asks for {', '.join(unknown)}, which is not in "
                               f"runners.devices ({', '.join(devices)})")
    else:
        pool = [d for d in devices if d != "cpu"] if kind == "KIND_GPU" else list(devices)
        if not pool:
            raise InvalidInput(f"config: instance_group[{i}] asks for KIND_GPU, but runners.devices has no GPU "
                               f"({', '.join(devices)})")
    # Each GPU gets its own copies, instance by instance, as Triton places them.
    return [pool[k % len(pool)] for k in range(count)] if gpus is None else \
        [d for d in pool for _ in range(count)]


def runner_opts(cfg: CartonConfig, triton_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The carton's [runner.opts], overridden by the load's Triton config
    "parameters" ({"key": {"string_value": "..."}} or plain values)."""
    opts: dict[str, Any] = dict(cfg.runner.opts)
    params = (triton_config or {}).get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidInput("config: 'parameters' must be an object")
    for key, value in params.items():
        opts[key] = value.get("string_value") if isinstance(value, dict) and "string_value" in value else value
    return opts


def sandbox_policy(settings: RunnerSettings, store_locks: Path | None = None) -> SandboxPolicy | None:
    """What every runner's sandbox holds ([runners]); None for sandbox = "none".
    ``store_locks``: the store's locks/, where a transient uid is held too."""
    if settings.sandbox == "none":
        return None
    return SandboxPolicy(settings.sandbox, settings.user, settings.memory_limit, settings.max_processes,
                         settings.sandbox_paths, settings.network,
                         uid_locks=(store_locks,) if store_locks is not None else ())


def instance_specs(plan: RunnerPlan, *, model_dir: Path, name: str, version: str, opts: Mapping[str, Any],
                   devices: list[str], run_dir: Path, generation: int,
                   sandbox: SandboxPolicy | None = None) -> list[InstanceSpec]:
    """One spec per device. generation tells the sockets of two starts of one
    version apart (a reload with a new config), so stopping the old runners
    never removes a socket the new ones serve on."""
    opts_json = json.dumps(opts, sort_keys=True)
    specs = []
    for i, device in enumerate(devices):
        socket = instance_socket_path(run_dir, f"{name}.g{generation}", version, i)
        argv = fill_argv(list(plan.command), model_dir=str(model_dir), socket=str(socket), name=name,
                         version=version, opts=opts_json, devices=device, python=sys.executable)
        specs.append(InstanceSpec(argv, dict(plan.env), socket, device, sandbox, name, model_dir))
    return specs
