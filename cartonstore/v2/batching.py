"""Joining v2 infer requests along their first (batch) dimension and
splitting the answer back: the pure half of dynamic batching (the daemon's
server/models/batcher.py decides when).

Requests are joined only when they mean the same call but for their rows:
the same inputs in the same order with the same datatypes and the same
dimensions after the first, the same request parameters and the same
requested outputs (batch_key). How each client wants its outputs (JSON or
binary) is its own: the joined call asks for binary, and each answer is
encoded again for its request (answers_for).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import json_codec
from .binary_form import tensor_bytes
from .encode import encode_infer_response
from .wire_types import InferRequest

# request parameters that say how the answer is framed, not what the model computes
_FRAMING_PARAMETERS = frozenset({"binary_data_output"})


def batch_key(req: InferRequest) -> tuple[Any, ...]:
    """Requests with equal keys may run as one call, joined along their first dimension."""
    inputs = tuple((t.name, t.datatype, tuple(t.shape[1:])) for t in req.inputs)
    parameters = {k: v for k, v in req.parameters.items() if k not in _FRAMING_PARAMETERS}
    outputs = None if req.outputs is None else tuple(
        (o.name, json_codec.dumps({k: v for k, v in o.parameters.items() if k != "binary_data"},
                                  exact=False)) for o in req.outputs)
    return inputs, json_codec.dumps(parameters, exact=False), outputs


def rows(req: InferRequest) -> int:
    """A request's batch size: its inputs' first dimension (validated equal)."""
    return req.inputs[0].shape[0] if req.inputs and req.inputs[0].shape else 1


def joined_request(reqs: Sequence[InferRequest]) -> tuple[list[bytes | memoryview], int]:
    """One request of all ``reqs`` (equal batch_keys), their rows in order:
    body parts (JSON header first) and the header's length. Outputs are
    asked for binary."""
    first = reqs[0]
    total = sum(rows(r) for r in reqs)
    entries, chunks = [], []
    for index, tensor in enumerate(first.inputs):
        parts = [tensor_bytes(r.inputs[index]) for r in reqs]
        size = sum(len(p) for p in parts)
        entries.append({"name": tensor.name, "datatype": tensor.datatype, "shape": [total, *tensor.shape[1:]],
                        "parameters": {"binary_data_size": size}})
        chunks += [p for p in parts if len(p)]
    doc: dict[str, Any] = {"inputs": entries,
                           "parameters": {**first.parameters, "binary_data_output": True}}
    if first.outputs is not None:
        doc["outputs"] = [{"name": o.name, "parameters": {**o.parameters, "binary_data": True}}
                          for o in first.outputs]
    header = json_codec.dumps(doc, exact=False)
    return [header, *chunks], len(header)


def split_outputs(arrays: dict[str, np.ndarray], sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """The joined call's outputs cut back into each request's rows
    (ValueError naming an output whose first dimension is not the total)."""
    total = sum(sizes)
    for name, array in arrays.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise ValueError(f"output {name!r} of a batch of {total} has shape {list(array.shape)}: a batched "
                             f"model's outputs must have the batch as their first dimension")
    bounds = np.cumsum([0, *sizes])
    return [{name: array[bounds[i]:bounds[i + 1]] for name, array in arrays.items()} for i in range(len(sizes))]


def answers_for(reqs: Sequence[InferRequest], doc: dict[str, Any], arrays: dict[str, np.ndarray],
                model_name: str) -> list[tuple[list[bytes | memoryview], int | None]]:
    """Each request's answer (body parts, header length or None for all
    JSON) from the joined call's response ``doc`` and decoded ``arrays``:
    its rows, its id, outputs framed as it asked."""
    pieces = split_outputs(arrays, [rows(r) for r in reqs])
    return [encode_infer_response(model_name=doc.get("model_name", model_name),
                                  model_version=doc.get("model_version"), request_id=req.id, outputs=piece,
                                  binary=req.wants_binary, parameters=doc.get("parameters"))
            for req, piece in zip(reqs, pieces, strict=True)]
