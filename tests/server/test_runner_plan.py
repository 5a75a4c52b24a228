"""runner_plan: which command runs a carton, on which devices, with which
opts; pure functions of the carton, the settings and the load's config."""

from __future__ import annotations

import sys
from pathlib import Path
from types import MappingProxyType

import pytest

from cartonstore.config.runners import RunnerCommand, RunnerSettings
from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import parse_carton_toml
from cartonstore.server.models.runner_plan import instance_devices, instance_specs, plan_runner, runner_opts


def carton(runner: str = "python", requirement: str = ">=3.8", opts: str = "") -> object:
    return parse_carton_toml(f'spec_version = 1\n[runner]\nrunner_name = "{runner}"\n'
                             f'required_framework_version = "{requirement}"\n[runner.opts]\n{opts}'.encode())


def settings(**kw: object) -> RunnerSettings:
    return RunnerSettings(**kw)  # type: ignore[arg-type]  # each test's fields, of their types


def test_builtin_runner_and_its_framework_version() -> None:
    plan = plan_runner(carton(), settings())
    assert plan is not None and plan.command[:3] == (sys.executable, "-m", "cartonstore.runner.backends.python")
    assert plan.framework_version == ".".join(map(str, sys.version_info[:3]))


def test_framework_mismatch_names_both() -> None:
    with pytest.raises(InvalidInput, match=r"requires python =2\.7, but the runner provides 3\."):
        plan_runner(carton(requirement="=2.7"), settings())


def test_a_runner_table_replaces_the_builtin_and_is_checked() -> None:
    mine = RunnerCommand(("/opt/serve", "{socket}"), MappingProxyType({"A": "1"}), "1.2.3")
    s = settings(commands=MappingProxyType({"python": mine}))
    plan = plan_runner(carton(requirement="^1.2"), s)
    assert plan is not None and plan.command == ("/opt/serve", "{socket}") and dict(plan.env) == {"A": "1"}
    with pytest.raises(InvalidInput, match="provides 1.2.3"):
        plan_runner(carton(requirement=">=2"), s)


@pytest.mark.parametrize(("runner", "builtin"), [("tensorflow", True), ("python", False)])
def test_no_runner_means_files_only(runner: str, builtin: bool) -> None:
    assert plan_runner(carton(runner=runner), settings(builtin=builtin)) is None


@pytest.mark.parametrize(("config", "devices", "expected"), [
    (None, ("cpu",), ["cpu"]),
    ({"instance_group": [{"count": 3}]}, ("cuda:0", "cuda:1"), ["cuda:0", "cuda:1", "cuda:0"]),
    ({"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}, ("cuda:0",), ["cpu", "cpu"]),
    ({"instance_group": [{"count": 2, "kind": "KIND_GPU"}]}, ("cpu", "cuda:1"), ["cuda:1", "cuda:1"]),
    ({"instance_group": [{"count": 2, "gpus": [0, 1]}]}, ("cuda:0", "cuda:1"),
     ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]),
    ({"instance_group": [{"kind": "KIND_CPU"}, {"count": 1, "gpus": [1]}]}, ("cpu", "cuda:1"), ["cpu", "cuda:1"]),
])
def test_instance_devices(config: dict | None, devices: tuple[str, ...], expected: list[str]) -> None:
    assert instance_devices(config, devices) == expected


@pytest.mark.parametrize(("config", "fragment"), [
    ({"instance_group": {"count": 1}}, "'instance_group' must be a list"),
    ({"instance_group": ["x"]}, "instance_group[0] must be an object"),
    ({"instance_group": [{"count": 0}]}, "instance_group[0].count must be an integer in [1, 64]"),
    ({"instance_group": [{"count": True}]}, "instance_group[0].count must be an integer"),
    ({"instance_group": [{"count": 65}]}, "[1, 64]"),
    ({"instance_group": [{"count": 40}, {"count": 40}]}, "80 instances asked for; at most 64"),
    ({"instance_group": [{"kind": "KIND_TPU"}]}, "is not KIND_AUTO, KIND_CPU or KIND_GPU"),
    ({"instance_group": [{"gpus": [3]}]}, "asks for cuda:3, which is not in runners.devices"),
    ({"instance_group": [{"gpus": [True]}]}, "gpus must be a list of GPU numbers"),
    ({"instance_group": [{"gpus": []}]}, "gpus must be a list of GPU numbers"),
])
def test_bad_instance_groups_are_named(config: dict, fragment: str) -> None:
    with pytest.raises(InvalidInput) as info:
        instance_devices(config, ("cpu", "cuda:0"))
    assert fragment in str(info.value)


def test_gpu_instances_need_a_gpu_device() -> None:
    with pytest.raises(InvalidInput, match=r"KIND_GPU, but runners.devices has no GPU \(cpu\)"):
        instance_devices({"instance_group": [{"kind": "KIND_GPU"}]}, ("cpu",))


def test_load_parameters_override_runner_opts() -> None:
    cfg = carton(opts='entrypoint_fn = "get"\nthreads = 2\n')
    config = {"parameters": {"threads": {"string_value": "8"}, "extra": True}}
    assert runner_opts(cfg, config) == {"entrypoint_fn": "get", "threads": "8", "extra": True}
    with pytest.raises(InvalidInput, match="'parameters' must be an object"):
        runner_opts(cfg, {"parameters": ["x"]})


def test_instance_specs_fill_the_template_with_unique_sockets(short_tmp: Path) -> None:
    plan = plan_runner(carton(), settings())
    assert plan is not None
    first = instance_specs(plan, model_dir=short_tmp / "m", name="echo", version="ab" * 32, opts={"k": 1},
                           devices=["cpu", "cuda:0"], run_dir=short_tmp, generation=1)
    again = instance_specs(plan, model_dir=short_tmp / "m", name="echo", version="ab" * 32, opts={"k": 1},
                           devices=["cpu"], run_dir=short_tmp, generation=2)
    assert [s.device for s in first] == ["cpu", "cuda:0"]
    assert len({s.socket_path for s in first + again}) == 3
    argv = first[1].argv
    assert argv[argv.index("--opts") + 1] == '{"k": 1}' and argv[argv.index("--devices") + 1] == "cuda:0"
    assert str(short_tmp / "m") in argv and str(first[1].socket_path) in argv


def test_a_configured_runner_serves_a_format_no_builtin_runner_serves() -> None:
    from cartonstore.carton.from_files import files_carton_toml

    weights = parse_carton_toml(files_carton_toml("org/llm", {"model.safetensors": 10}))
    vllm = RunnerCommand(("/opt/vllm-runner", "{socket}"), MappingProxyType({}), "0.9.1")
    plan = plan_runner(weights, settings(commands=MappingProxyType({"safetensors": vllm})))
    assert plan is not None and plan.command[0] == "/opt/vllm-runner"
    assert plan_runner(weights, settings()) is None
