"""The parsed forms of a v2 infer body: its tensors, its requested outputs,
the request as a whole. Plain values at the bottom of the v2 layer, so that
the parser (framing.py) and the numpy side (tensors.py) both name them
without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .shared_memory import ShmRef


@dataclass(slots=True)
class WireTensor:
    """One request input or response output as it came over the wire."""

    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any]
    data: memoryview | None = None  # binary bytes (binary_data_size given), else None
    json_data: Any | None = None  # the JSON "data" field, else None
    role: str = "input"  # "input" or "output": only for error messages
    shm: ShmRef | None = None  # where its bytes are in shared memory (then data is filled by who maps it)
    json_numbers: bool = False  # json_data is a flat array of ints and floats alone (the parser saw them)

    @property
    def what(self) -> str:
        return f"{self.role} {self.name!r}"


@dataclass(slots=True)
class RequestedOutput:
    name: str
    binary: bool | None
    parameters: dict[str, Any]
    shm: ShmRef | None = None  # written into this shared memory, not sent


@dataclass(slots=True)
class InferRequest:
    id: str | None
    inputs: list[WireTensor]
    outputs: list[RequestedOutput] | None  # None: all outputs
    parameters: dict[str, Any]
    binary_data_output: bool
    header: dict[str, Any] | None = None  # the JSON object as parsed (None: a raw binary request)

    def wants_binary(self, output_name: str) -> bool:
        """Per-output "binary_data" wins over the request's "binary_data_output"."""
        if self.outputs is not None:
            for output in self.outputs:
                if output.name == output_name and output.binary is not None:
                    return output.binary
        return self.binary_data_output

    def shm_outputs(self) -> dict[str, ShmRef]:
        """The requested outputs to be written into shared memory."""
        return {} if self.outputs is None else {o.name: o.shm for o in self.outputs if o.shm is not None}


# ---------------------------------------------------------------- parsing
