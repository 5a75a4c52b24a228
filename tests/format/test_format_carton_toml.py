"""carton.toml parsing, validation and reference checks."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import tomli_w

from cartonstore.errors import InvalidCarton
from cartonstore.format.carton_toml import (
    CartonConfig,
    RunnerInfo,
    TensorSpec,
    check_references,
    parse_carton_toml,
)

MINIMAL = b'spec_version = 1\n[runner]\nrunner_name = "torchscript"\nrequired_framework_version = "=1.12.1"\n'

FULL: dict[str, Any] = {
    "spec_version": 1,
    "model_name": "super_awesome_test_model",
    "short_description": "A short description.",
    "model_description": "Long\ntext with @misc/not_checked.png",
    "license": "Apache-2.0",
    "repository": "https://github.com/VivekPanyam/carton",
    "homepage": "https://carton.run",
    "required_platforms": ["x86_64-unknown-linux-gnu", "aarch64-apple-darwin"],
    "input": [
        {
            "name": "x",
            "dtype": "float32",
            "shape": ["batch_size", 3, 512, 512],
            "description": "Something",
            "internal_name": "some_namespace/in_x:0",
        },
        {"name": "y", "dtype": "string", "shape": "*"},
        {"name": "z", "dtype": "uint8", "shape": []},
    ],
    "output": [{"name": "out", "shape": "input_shape", "dtype": "float64"}],
    "self_test": [
        {
            "name": "",
            "inputs": {"x": "@tensor_data/t0", "y": "@tensor_data/t1"},
            "expected_out": {"out": "@tensor_data/t2"},
        },
        {"inputs": {"z": "@tensor_data/t3"}},
    ],
    "example": [
        {
            "description": "an image",
            "inputs": {"x": "@misc/input.png", "y": "@tensor_data/t1"},
            "sample_out": {"out": "@misc/sub/out.png"},
        }
    ],
    "runner": {
        "runner_name": "torchscript",
        "required_framework_version": "=1.12.1",
        "runner_compat_version": 2,
        "opts": {"num_threads": 1, "ratio": 0.5, "mode": "fast", "debug": False},
        "future_field": [1, 2],
    },
    "future_table": {"anything": True},
}


def dump(data: dict[str, Any]) -> bytes:
    return tomli_w.dumps(data).encode()


def changed(change: Callable[[dict[str, Any]], Any]) -> bytes:
    data = copy.deepcopy(FULL)
    change(data)
    return dump(data)


def test_minimal_file() -> None:
    config = parse_carton_toml(MINIMAL)
    assert config.spec_version == 1
    assert config.runner == RunnerInfo("torchscript", "=1.12.1", None, {})
    assert config.inputs is None and config.outputs is None
    assert config.self_tests == () and config.examples == ()
    assert config.required_platforms == ()
    assert config.model_name is None
    assert config.tensor_references() == set() and config.misc_references() == set()


def test_full_file() -> None:
    config = parse_carton_toml(dump(FULL))
    assert isinstance(config, CartonConfig)
    assert config.model_name == "super_awesome_test_model"
    assert config.license == "Apache-2.0"
    assert config.required_platforms == ("x86_64-unknown-linux-gnu", "aarch64-apple-darwin")
    assert config.inputs == (
        TensorSpec("x", "float32", ("batch_size", 3, 512, 512), "Something", "some_namespace/in_x:0"),
        TensorSpec("y", "string", "*"),
        TensorSpec("z", "uint8", ()),
    )
    assert config.outputs == (TensorSpec("out", "float64", "input_shape"),)
    assert config.self_tests[0].name == ""
    assert config.self_tests[0].expected_out == {"out": "@tensor_data/t2"}
    assert config.self_tests[1].expected_out is None
    assert config.examples[0].inputs == {"x": "@misc/input.png", "y": "@tensor_data/t1"}
    assert config.runner.runner_compat_version == 2
    assert config.runner.opts == {"num_threads": 1, "ratio": 0.5, "mode": "fast", "debug": False}
    assert config.tensor_references() == {"t0", "t1", "t2", "t3"}
    assert config.misc_references() == {"misc/input.png", "misc/sub/out.png"}


def test_config_is_frozen_and_hashable_specs() -> None:
    config = parse_carton_toml(dump(FULL))
    with pytest.raises(AttributeError):
        config.model_name = "x"  # type: ignore[misc]  # a frozen field, written on purpose
    assert len({*config.inputs}) == 3  # type: ignore[misc]  # hashable, which is what is tested


def test_missing_shape_is_none() -> None:
    config = parse_carton_toml(changed(lambda d: d["input"][0].pop("shape")))
    assert config.inputs is not None and config.inputs[0].shape is None


def test_empty_input_and_output_lists_count_as_declared() -> None:
    data = {"spec_version": 1, "input": [], "output": [], "runner": FULL["runner"]}
    config = parse_carton_toml(dump(data))
    assert config.inputs == () and config.outputs == ()


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change that sets (or, for value DELETE, removes) a dotted path; ints index lists."""

    def change(data: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        target = data
        for part in parents:
            target = target[part]
        if value is DELETE:
            del target[last]
        else:
            target[last] = value

    return change


DELETE = object()

BAD: list[tuple[Callable[[dict[str, Any]], Any], str, str]] = [
    (_set("spec_version", DELETE), "spec_version", "is required but missing"),
    (_set("spec_version", 2), "spec_version", "unsupported spec_version 2"),
    (_set("spec_version", "1"), "spec_version", "must be an integer, not a string"),
    (_set("spec_version", True), "spec_version", "must be an integer, not a boolean"),
    (_set("model_name", 3), "model_name", "must be a string, not an integer"),
    (_set("short_description", "x" * 101), "short_description", "101 characters long; the limit is 100"),
    (_set("model_description", ["a"]), "model_description", "must be a string, not an array"),
    (_set("license", {"a": 1}), "license", "must be a string, not a table"),
    (_set("repository", 1.5), "repository", "must be a string, not a float"),
    (_set("homepage", False), "homepage", "must be a string, not a boolean"),
    (_set("required_platforms", "x86_64-unknown-linux-gnu"), "required_platforms", "must be an array"),
    (_set("required_platforms", [3]), "required_platforms[0]", "must be a string"),
    (_set("required_platforms", ["aninvalidplatform"]), "required_platforms[0]", "not a target triple"),
    (_set("input", {"name": "x"}), "input", "must be an array, not a table"),
    (_set("input", [3]), "input[0]", r"must be a table \(\[\[input\]\]\), not an integer"),
    (_set("input.1.name", DELETE), "input[1].name", "is required but missing"),
    (_set("input.1.name", ""), "input[1].name", "must not be empty"),
    (_set("input.1.name", "x"), "input[1].name", "'x' is used by another input"),
    (_set("input.1.dtype", "float16"), "input[1].dtype", "'float16' is not a carton dtype"),
    (_set("input.1.dtype", DELETE), "input[1].dtype", "is required but missing"),
    (_set("input.1.shape", 3), "input[1].shape", "must be a symbol, '\\*' or a list, not an integer"),
    (_set("input.1.shape", ""), "input[1].shape", "not an empty string"),
    (_set("input.0.shape", [1, -2]), "input[0].shape[1]", "must not be negative, not -2"),
    (_set("input.0.shape", [1, 2.0]), "input[0].shape[1]", "not a float"),
    (_set("input.0.shape", [1, ""]), "input[0].shape[1]", "not an empty string"),
    (_set("input.0.shape", [[1]]), "input[0].shape[0]", "not an array"),
    (_set("input.0.description", 1), "input[0].description", "must be a string"),
    (_set("input.0.internal_name", 1), "input[0].internal_name", "must be a string"),
    (_set("output.0.name", DELETE), "output[0].name", "is required but missing"),
    (_set("output", [{"name": "o", "dtype": "int8"}, {"name": "o", "dtype": "int8"}]), "output[1].name", "used by another output"),
    (_set("output", DELETE), "self_test[0].expected_out.out", "'out' is not a declared output \\(none\\)"),
    (_set("input", DELETE), "self_test", "needs \\[\\[input\\]\\] to be declared"),
    (_set("self_test", {"inputs": {}}), "self_test", "must be an array"),
    (_set("self_test.0.inputs", DELETE), "self_test[0].inputs", "is required but missing"),
    (_set("self_test.0.inputs", "x"), "self_test[0].inputs", "must be a table"),
    (_set("self_test.0.inputs.w", "@tensor_data/t"), "self_test[0].inputs.w", "'w' is not a declared input \\(x, y, z\\)"),
    (_set("self_test.0.inputs.x", "@misc/a.png"), "self_test[0].inputs.x", "self tests can only use tensor_data"),
    (_set("self_test.0.inputs.x", "@..."), "self_test[0].inputs.x", "must be a reference like '@tensor_data/<name>'"),
    (_set("self_test.0.inputs.x", "@tensor_data/"), "self_test[0].inputs.x", "must be a reference"),
    (_set("self_test.0.inputs.x", 3), "self_test[0].inputs.x", "must be a string"),
    (_set("self_test.0.expected_out.x", "@tensor_data/t"), "self_test[0].expected_out.x", "not a declared output \\(out\\)"),
    (_set("self_test.0.expected_out", []), "self_test[0].expected_out", "must be a table"),
    (_set("self_test.0.name", 1), "self_test[0].name", "must be a string"),
    (_set("self_test.0.description", 1), "self_test[0].description", "must be a string"),
    (_set("example.0.sample_out", DELETE), "example[0].sample_out", "is required but missing"),
    (_set("example.0.inputs", DELETE), "example[0].inputs", "is required but missing"),
    (_set("example.0.inputs.q", "@misc/a"), "example[0].inputs.q", "not a declared input"),
    (_set("example.0.sample_out.x", "@misc/a"), "example[0].sample_out.x", "not a declared output"),
    (_set("example.0.inputs.x", "@misc/../carton.toml"), "example[0].inputs.x", "'..' component"),
    (_set("example.0.inputs.x", "@misc/"), "example[0].inputs.x", "ends with '/'"),
    (_set("example.0.inputs.x", "misc/a.png"), "example[0].inputs.x", "'@tensor_data/<name>' or '@misc/<path>'"),
    (_set("example.0.inputs.x", "https://x/a.png"), "example[0].inputs.x", "must be a reference"),
    (_set("example.0.name", []), "example[0].name", "must be a string"),
    (_set("runner", DELETE), "runner", "is required but missing"),
    (_set("runner", "torch"), "runner", "must be a table"),
    (_set("runner.runner_name", DELETE), "runner.runner_name", "is required but missing"),
    (_set("runner.runner_name", ""), "runner.runner_name", "must not be empty"),
    (_set("runner.runner_name", 1), "runner.runner_name", "must be a string"),
    (_set("runner.required_framework_version", DELETE), "runner.required_framework_version", "is required"),
    (_set("runner.required_framework_version", 1.12), "runner.required_framework_version", "must be a string"),
    (_set("runner.required_framework_version", "latest"), "runner.required_framework_version", "not a semver"),
    (_set("runner.required_framework_version", ""), "runner.required_framework_version", "not a semver"),
    (_set("runner.required_framework_version", ">=1,"), "runner.required_framework_version", "not a semver"),
    (_set("runner.runner_compat_version", "2"), "runner.runner_compat_version", "must be an integer"),
    (_set("runner.runner_compat_version", -1), "runner.runner_compat_version", "at least 0"),
    (_set("runner.opts", 3), "runner.opts", "must be a table"),
    (_set("runner.opts.threads", [1, 2]), "runner.opts.threads", "string, integer, float or boolean, not an array"),
    (_set("runner.opts.nested", {"a": 1}), "runner.opts.nested", "not a table"),
]


@pytest.mark.parametrize(("change", "field", "problem"), BAD)
def test_rejects_bad_fields(change: Callable[[dict[str, Any]], Any], field: str, problem: str) -> None:
    with pytest.raises(InvalidCarton, match=problem) as info:
        parse_carton_toml(changed(change))
    assert info.value.file == "carton.toml"
    assert info.value.field == field


def test_self_test_and_example_need_declared_tensors() -> None:
    for key in ("self_test", "example"):
        data = {k: v for k, v in FULL.items() if k not in ("input", "output")}
        with pytest.raises(InvalidCarton, match=r"needs \[\[input\]\] and \[\[output\]\]") as info:
            parse_carton_toml(dump(data))
        assert info.value.field == "self_test"  # the first one found
        data.pop("self_test")
        if key == "example":
            with pytest.raises(InvalidCarton, match="needs") as info:
                parse_carton_toml(dump(data))
            assert info.value.field == "example"


@pytest.mark.parametrize(
    "version",
    ["=1.12.1", "1.2.3", "^1.2", "~1", ">=1.0, <2.0", "*", "1.x", "=3.11", ">= 2.0.0-rc.1", "1.2.3+build.5"],
)
def test_accepts_semver_requirements(version: str) -> None:
    config = parse_carton_toml(changed(_set("runner.required_framework_version", version)))
    assert config.runner.required_framework_version == version


@pytest.mark.parametrize(
    ("raw", "field", "problem"),
    [
        (b"spec_version = 1\n[runner\n", "line 2", "not valid TOML"),
        (b"spec_version = 1\nspec_version = 1\n", "line 2", "not valid TOML"),
        (b"spec_version = \xff\n", "line 1", "not valid UTF-8"),
        (b"spec_version = 1" + b"0" * 20 + b"\n", "spec_version", "does not fit in 64 bits"),
        (b"spec_version = " + b"9" * 5000 + b"\n", None, "a number has too many digits"),
        (b"a = " + b"[" * 2000 + b"]" * 2000 + b"\n", None, "nested too deeply"),
        (b"model_name = 1979-05-27T07:32:00Z\n" + MINIMAL, "model_name", "not a date/time"),
        (b"spec_version = 1\n[runner]\nrunner_name = 'x'\nrequired_framework_version = '1'\n"
         b"opts = { when = 1979-05-27 }\n", "runner.opts.when", "not a date/time"),
    ],
)
def test_rejects_bad_toml(raw: bytes, field: str | None, problem: str) -> None:
    with pytest.raises(InvalidCarton, match=problem) as info:
        parse_carton_toml(raw)
    assert info.value.file == "carton.toml"
    assert info.value.field == field


def test_odd_keys_are_quoted_in_fields() -> None:
    data = copy.deepcopy(FULL)
    data["input"][0]["name"] = "x.y"
    data["self_test"] = [{"inputs": {"x.y": "nope"}}]
    with pytest.raises(InvalidCarton) as info:
        parse_carton_toml(dump(data))
    assert info.value.field == "self_test[0].inputs.'x.y'"


MANIFEST_PATHS = {"carton.toml", "misc/input.png", "misc/sub/out.png", "tensor_data/index.toml"}
TENSORS = {"t0", "t1", "t2", "t3"}


def test_check_references_passes_when_everything_exists() -> None:
    check_references(parse_carton_toml(dump(FULL)), MANIFEST_PATHS, TENSORS)
    check_references(parse_carton_toml(MINIMAL), set(), set())


@pytest.mark.parametrize(
    ("paths", "tensors", "field", "problem"),
    [
        (MANIFEST_PATHS, TENSORS - {"t0"}, "self_test[0].inputs.x", "tensor 't0', which tensor_data/index.toml"),
        (MANIFEST_PATHS, TENSORS - {"t2"}, "self_test[0].expected_out.out", "tensor 't2'"),
        (MANIFEST_PATHS, TENSORS - {"t3"}, "self_test[1].inputs.z", "tensor 't3'"),
        (MANIFEST_PATHS - {"misc/input.png"}, TENSORS, "example[0].inputs.x", "misc/input.png, which the MANIFEST"),
        (MANIFEST_PATHS - {"misc/sub/out.png"}, TENSORS, "example[0].sample_out.out", "misc/sub/out.png"),
        (MANIFEST_PATHS, set(), "self_test[0].inputs.x", "does not define"),
    ],
)
def test_check_references_names_the_missing_thing(
    paths: set[str], tensors: set[str], field: str, problem: str
) -> None:
    config = parse_carton_toml(dump(FULL))
    with pytest.raises(InvalidCarton, match=problem) as info:
        check_references(config, paths, tensors)
    assert info.value.file == "carton.toml"
    assert info.value.field == field
