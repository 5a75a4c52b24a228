"""A model checked against what its carton.toml declares.

At load: an ONNX graph's inputs and outputs (names, element types, ranks,
fixed dimensions) against the declared tensors, every mismatch named in
one refusal (graph_problems). At infer: what a model returned against the
declared outputs, so a response never carries a tensor the metadata does
not announce, nor another dtype or shape (output_problem).

Pure: no onnxruntime here (graph_problems takes its NodeArgs' plain
fields), numpy for the outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cartonstore.format.carton_toml import TensorSpec
from cartonstore.format.dtypes import ONNX_TO_CARTON, carton_numpy_dtype, onnx_kind_text


def _names(items: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in items) or "none"


def _shape_problems(role: str, spec: TensorSpec, graph_shape: Sequence[Any] | None) -> list[str]:
    declared = spec.shape
    if not isinstance(declared, tuple) or not graph_shape:
        return []   # "any shape" declared, or a graph that does not say (onnxruntime gives [] for an unknown rank)
    if len(declared) != len(graph_shape):
        return [f"{role} {spec.name!r} has rank {len(graph_shape)} in the graph ({list(graph_shape)}) but "
                f"{len(declared)} in carton.toml ({list(declared)})"]
    return [f"{role} {spec.name!r} dimension {axis} is {theirs} in the graph but {ours} in carton.toml"
            for axis, (ours, theirs) in enumerate(zip(declared, graph_shape, strict=True))
            if isinstance(ours, int) and isinstance(theirs, int) and ours != theirs]


def graph_problems(graph_inputs: Sequence[tuple[str, str, Any]], graph_outputs: Sequence[tuple[str, str, Any]],
                   inputs: Sequence[TensorSpec] | None, outputs: Sequence[TensorSpec] | None,
                   optional_inputs: Sequence[tuple[str, str, Any]] = ()) -> list[str]:
    """Every way an ONNX graph, given as (name, type, shape) of its inputs
    and outputs, differs from the declared tensors (None: not declared,
    nothing to check). ``optional_inputs``: initializers a caller may
    override (declaring them is allowed, not needed)."""
    problems: list[str] = []
    sides = (("input", [*graph_inputs, *optional_inputs], inputs), ("output", graph_outputs, outputs))
    for role, graph, declared in sides:
        if declared is None:
            continue
        by_name = {name: (kind, shape) for name, kind, shape in graph}
        for spec in declared:
            if spec.name not in by_name:
                problems.append(f"{role} {spec.name!r} is not in the model's graph (its {role}s: "
                                f"{_names([g[0] for g in graph])})")
                continue
            kind, shape = by_name[spec.name]
            dtype = ONNX_TO_CARTON.get(kind)
            if dtype is None:
                problems.append(f"{role} {spec.name!r} is {onnx_kind_text(kind)}")
                continue
            if dtype != spec.dtype:
                problems.append(f"{role} {spec.name!r} is {dtype} in the graph but {spec.dtype} in carton.toml")
            problems += _shape_problems(role, spec, shape)
        if role == "input":
            missing = [name for name, _, _ in graph_inputs if name not in {s.name for s in declared}]
            if missing:
                problems.append(f"the graph needs input(s) {_names(missing)} that carton.toml does not declare")
    return problems


def output_problem(name: str, value: np.ndarray, declared: dict[str, TensorSpec]) -> str | None:
    """Why output ``name`` as the model returned it is not what carton.toml
    declares (None when it is)."""
    spec = declared.get(name)
    if spec is None:
        return f"the model returned output {name!r}, which carton.toml does not declare ({_names(list(declared))})"
    if spec.dtype == "string":
        if value.dtype.kind not in "OSU":
            return f"output {name!r} is {value.dtype} but carton.toml declares string"
    elif value.dtype.newbyteorder("<") != carton_numpy_dtype(spec.dtype):
        return f"output {name!r} is {value.dtype} but carton.toml declares {spec.dtype}"
    declared_shape = spec.shape
    if isinstance(declared_shape, tuple):
        if len(declared_shape) != value.ndim:
            return (f"output {name!r} has shape {list(value.shape)} but carton.toml declares "
                    f"{list(declared_shape)}")
        for axis, dim in enumerate(declared_shape):
            if isinstance(dim, int) and dim != value.shape[axis]:
                return (f"output {name!r} has shape {list(value.shape)} but carton.toml declares "
                        f"{list(declared_shape)}")
    return None


# -- TorchScript: forward's schema against the declaration -----------------
# TorchScript types as torch prints them: "Tensor", "Optional[Tensor]",
# "List[str]", "Dict[str, Tensor]", "Tuple[Tensor, Tensor]". A Tensor type
# carries no dtype or rank; self-tests check those at load, output_problem
# at every infer.

_TENSOR_TYPES = {"Tensor", "Optional[Tensor]"}
_STRING_TYPES = {"str", "List[str]", "Optional[str]", "Optional[List[str]]"}


def takes_input_dict(arguments: Sequence[tuple[str, str, bool]]) -> bool:
    """Carton's convention: forward takes one Dict[str, Tensor] of all inputs
    (``arguments`` as (name, type, has_default), self left out)."""
    return len(arguments) == 1 and arguments[0][1].startswith("Dict[str, ")


def _tuple_elements(text: str) -> list[str]:
    """"Tuple[Tensor, List[str]]" -> ["Tensor", "List[str]"]."""
    body, depth, start, out = text[len("Tuple["):-1], 0, 0, []
    for index, char in enumerate(body):
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            out.append(body[start:index].strip())
            start = index + 1
    return [*out, body[start:].strip()] if body.strip() else out


def _value_problem(role: str, spec: TensorSpec, type_text: str) -> str | None:
    wanted = _STRING_TYPES if spec.dtype == "string" else _TENSOR_TYPES
    if type_text in wanted:
        return None
    takes = "str or List[str]" if spec.dtype == "string" else "Tensor"
    return f"{role} {spec.name!r} is {spec.dtype} in carton.toml, which the runner passes as {takes}, but forward's " \
           f"{'argument' if role == 'input' else 'result'} is {type_text}"


def forward_problems(arguments: Sequence[tuple[str, str, bool]], returns: str,
                     inputs: Sequence[TensorSpec] | None, outputs: Sequence[TensorSpec] | None) -> list[str]:
    """Every way a TorchScript forward, given as its arguments (name, type,
    has_default; self left out) and its return type, cannot take the declared
    inputs or give the declared outputs (None: not declared)."""
    problems: list[str] = []
    if inputs is not None and takes_input_dict(arguments):
        values = arguments[0][1][len("Dict[str, "):-1]   # what the dict holds: only strings take a string input
        problems += [f"input {s.name!r} is a string, but forward takes one {arguments[0][1]}"
                     for s in inputs if s.dtype == "string" and values not in _STRING_TYPES and values != "Any"]
    elif inputs is not None:
        by_name = {name: type_text for name, type_text, _ in arguments}
        for spec in inputs:
            if spec.name not in by_name:
                problems.append(f"input {spec.name!r} is not an argument of forward (its arguments: "
                                f"{_names(list(by_name))})")
            elif (problem := _value_problem("input", spec, by_name[spec.name])) is not None:
                problems.append(problem)
        declared = {s.name for s in inputs}
        missing = [name for name, _, has_default in arguments if not has_default and name not in declared]
        if missing:
            problems.append(f"forward needs argument(s) {_names(missing)} that carton.toml does not declare")
    if outputs is None or returns.startswith(("Dict[str, ", "List[Tensor]", "__torch__.")):
        return problems   # named by the model, as many as it returns, or a NamedTuple's fields: checked at infer
    results = _tuple_elements(returns) if returns.startswith("Tuple[") else [returns]
    if len(results) != len(outputs):
        problems.append(f"forward returns {len(results)} value(s) ({returns}) but carton.toml declares "
                        f"{len(outputs)} output(s): {_names([s.name for s in outputs])}")
        return problems
    problems += [p for spec, result in zip(outputs, results, strict=True)
                 if (p := _value_problem("output", spec, result)) is not None]
    return problems
