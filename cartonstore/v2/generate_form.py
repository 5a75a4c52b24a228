"""Triton's generate extension's JSON, both ways, pure: a generate
request's fields as a v2 infer request, and a v2 response as a generate
response.

A request is one JSON object. A field named as one of the model's inputs
is that input: a string, number or boolean is a tensor of shape [1], an
array one of its own shape (nested arrays: one dimension each), in the
input's declared datatype. ``"id"`` is the request's id, ``"parameters"``
(an object) its parameters; any other field is a parameter too, as Triton
passes them, when its value is a string, number or boolean (anything else
is refused by name).

A response is one JSON object: ``model_name``, ``model_version``, ``id``
when the request had one, and each output by name: its one element when it
has one (``text_output``: "..."), else its elements as nested arrays;
BYTES elements as text where they are UTF-8.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cartonstore.errors import InvalidInput

from .tensors import tensor_to_numpy
from .wire_types import WireTensor

_SCALARS = (str, int, float, bool)


def generate_request(body: Any, datatypes: Mapping[str, str]) -> dict[str, Any]:
    """The v2 infer request (JSON form) a generate request's ``body`` asks
    for, ``datatypes`` the model's inputs' v2 datatypes by name;
    InvalidInput naming what is wrong."""
    if not isinstance(body, dict):
        raise InvalidInput(f"a generate request is a JSON object, not {type(body).__name__}")
    inputs: list[dict[str, Any]] = []
    parameters: dict[str, Any] = {}
    doc: dict[str, Any] = {}
    for key, value in body.items():
        if key == "id":
            if not isinstance(value, str):
                raise InvalidInput(f"generate: 'id' must be a string, not {type(value).__name__}", subject="id")
            doc["id"] = value
        elif key == "parameters":
            if not isinstance(value, dict):
                raise InvalidInput(f"generate: 'parameters' must be an object, not {type(value).__name__}",
                                   subject="parameters")
            parameters.update(value)
        elif key in datatypes:
            inputs.append({"name": key, "datatype": datatypes[key], "shape": _shape(key, value),
                           "data": _flat(value)})
        elif isinstance(value, _SCALARS):
            parameters[key] = value
        else:
            raise InvalidInput(f"generate: field {key!r} is no input of the model (its inputs: "
                               f"{', '.join(datatypes) or 'none'}), and a parameter is a string, number or "
                               f"boolean, not {type(value).__name__}", subject=key)
    missing = [name for name in datatypes if name not in body]
    if missing:
        raise InvalidInput(f"generate: the model's input{'s' if len(missing) > 1 else ''} "
                           f"{', '.join(repr(m) for m in missing)} not given (a field of the same name)",
                           subject=missing[0])
    doc["inputs"] = inputs
    if parameters:
        doc["parameters"] = parameters
    return doc


def _shape(name: str, value: Any) -> list[int]:
    shape: list[int] = []
    level = value
    while isinstance(level, list):
        shape.append(len(level))
        if not level:
            break
        level = level[0]
    if not shape and not isinstance(value, _SCALARS):
        raise InvalidInput(f"generate: input {name!r} must be a string, number, boolean or array, not "
                           f"{type(value).__name__}", subject=name)
    return shape or [1]


def _flat(value: Any) -> list[Any]:
    if not isinstance(value, list):
        return [value]
    out: list[Any] = []
    for item in value:
        out.extend(_flat(item))
    return out


def generate_response(doc: Mapping[str, Any], outputs: Sequence[WireTensor]) -> dict[str, Any]:
    """A v2 response (its JSON header and outputs, their bytes in ``data``
    or JSON in ``json_data``) as a generate response."""
    answer: dict[str, Any] = {"model_name": doc.get("model_name", ""), "model_version": doc.get("model_version", "")}
    if doc.get("id"):
        answer["id"] = doc["id"]
    for tensor in outputs:
        answer[tensor.name] = _json_value(tensor_to_numpy(tensor))
    return answer


def _json_value(array: np.ndarray) -> Any:
    """One element as itself; more as (nested) arrays."""
    items = [_text(e) for e in array.reshape(-1).tolist()]
    if len(items) == 1:
        return items[0]
    return items if array.ndim <= 1 else np.array(items, dtype=object).reshape(array.shape).tolist()


def _text(element: Any) -> Any:
    if isinstance(element, bytes):
        try:
            return element.decode("utf-8")
        except UnicodeDecodeError:
            return element.decode("latin-1")
    return element
