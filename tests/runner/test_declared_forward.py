"""A TorchScript forward's schema against carton.toml (runner/declared.py's
forward_problems), as plain data: each mismatch named, and what matches
left alone. The same checks on real TorchScript files, through a daemon,
are in tests/server/test_model_checks.py."""

from __future__ import annotations

import pytest

from cartonstore.format.carton_toml import TensorSpec
from cartonstore.runner.declared import forward_problems, takes_input_dict


def _specs(*items: tuple[str, str]) -> list[TensorSpec]:
    return [TensorSpec(name, dtype, "*") for name, dtype in items]


def test_the_dict_convention_takes_any_tensor_names_but_no_strings() -> None:
    args = [("inputs", "Dict[str, Tensor]", False)]
    assert takes_input_dict(args) and not takes_input_dict([("x", "Tensor", False)])
    assert forward_problems(args, "Dict[str, Tensor]", _specs(("a", "float32"), ("b", "int64")),
                            _specs(("y", "float32"))) == []
    assert forward_problems(args, "Dict[str, Tensor]", _specs(("s", "string")), None) == [
        "input 's' is a string, but forward takes one Dict[str, Tensor]"]
    for holder in ("Dict[str, List[Tensor]]", "Dict[str, Optional[Tensor]]"):   # tensors all the same
        assert forward_problems([("inputs", holder, False)], "Tensor", _specs(("s", "string")), None) == [
            f"input 's' is a string, but forward takes one {holder}"]
    assert forward_problems([("inputs", "Dict[str, List[str]]", False)], "Tensor", _specs(("s", "string")),
                            None) == []


def test_keyword_arguments_are_matched_by_name_and_kind() -> None:
    args = [("x", "Tensor", False), ("mask", "Optional[Tensor]", True), ("words", "List[str]", False),
            ("k", "int", True)]
    ok = _specs(("x", "float32"), ("words", "string"))
    assert forward_problems(args, "Tensor", ok, _specs(("y", "float32"))) == []
    assert forward_problems(args, "Tensor", [*ok, *_specs(("mask", "bool"))], None) == []
    problems = forward_problems(args, "Tensor", _specs(("features", "float32"), ("k", "int64"), ("words", "float32")),
                                None)
    assert problems == [
        "input 'features' is not an argument of forward (its arguments: 'x', 'mask', 'words', 'k')",
        "input 'k' is int64 in carton.toml, which the runner passes as Tensor, but forward's argument is int",
        "input 'words' is float32 in carton.toml, which the runner passes as Tensor, but forward's argument is "
        "List[str]",
        "forward needs argument(s) 'x' that carton.toml does not declare",
    ]


@pytest.mark.parametrize("returns,outputs,expected", [
    ("Tensor", [("y", "float32")], []),
    ("Tensor", [("y", "float32"), ("z", "float32")],
     ["forward returns 1 value(s) (Tensor) but carton.toml declares 2 output(s): 'y', 'z'"]),
    ("Tuple[Tensor, Tensor]", [("y", "float32")],
     ["forward returns 2 value(s) (Tuple[Tensor, Tensor]) but carton.toml declares 1 output(s): 'y'"]),
    ("Tuple[Tensor, List[str]]", [("y", "float32"), ("tags", "string")], []),
    ("Tuple[Tensor, List[str]]", [("tags", "string"), ("y", "float32")],
     ["output 'tags' is string in carton.toml, which the runner passes as str or List[str], but forward's result is "
      "Tensor",
      "output 'y' is float32 in carton.toml, which the runner passes as Tensor, but forward's result is List[str]"]),
    ("Tuple[Dict[str, Tensor], Tensor]", [("a", "float32"), ("b", "float32")],
     ["output 'a' is float32 in carton.toml, which the runner passes as Tensor, but forward's result is "
      "Dict[str, Tensor]"]),
    ("int", [("n", "int64")],
     ["output 'n' is int64 in carton.toml, which the runner passes as Tensor, but forward's result is int"]),
    # named by the model, or as many as it returns: left to the check at infer
    ("Dict[str, Tensor]", [("y", "float32"), ("z", "int64")], []),
    ("List[Tensor]", [("y", "float32"), ("z", "int64")], []),
], ids=["one", "one-of-two", "two-of-one", "tuple", "tuple-swapped", "nested", "int", "dict", "list"])
def test_what_forward_returns_is_matched_by_count_and_kind(returns: str, outputs: list, expected: list) -> None:
    assert forward_problems([("x", "Tensor", False)], returns, _specs(("x", "float32")), _specs(*outputs)) == expected


def test_nothing_declared_nothing_checked() -> None:
    assert forward_problems([("x", "Tensor", False)], "int", None, None) == []


def test_a_named_tuple_and_a_dict_of_strings_are_left_to_infer() -> None:
    """A NamedTuple prints as its class (its fields are checked at infer);
    a Dict[str, List[str]] takes string inputs."""
    assert forward_problems([("x", "Tensor", False)], "__torch__.Out", _specs(("x", "float32")),
                            _specs(("a", "float32"), ("b", "float32"))) == []
    assert forward_problems([("inputs", "Dict[str, List[str]]", False)], "Tensor", _specs(("words", "string")),
                            None) == []
