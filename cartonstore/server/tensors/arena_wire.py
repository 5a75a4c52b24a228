"""An infer request whose body is in an arena slot (arena.py), in the form
a runner that maps the arena takes it, and the runner's answer back in the
client's form.

To the runner: the client's JSON header, with each binary input's
binary_data_size swapped for Triton's shared-memory parameters naming its
bytes in the slot (region ARENA_REGION), and the request parameter
ARENA_OUTPUTS giving the slot's second half to binary outputs. The body
is that JSON alone. Back: outputs the runner put in the arena become
binary_data_size entries again, their bytes sent from the slot; outputs it
sent in its body stay where they were, in the same order.
"""

from __future__ import annotations

import json
from typing import Any

from cartonstore.errors import BadUpstream
from cartonstore.runner.protocol import ARENA_OUTPUTS, ARENA_REGION
from cartonstore.v2.framing import HEADER_LENGTH, InferRequest
from cartonstore.v2.shared_memory import BYTE_SIZE, OFFSET, REGION

from .arena import ArenaSlot

MAX_HEADER = 64 * 1024   # bigger JSON headers (JSON data in them) are forwarded as they came: re-encoding costs more
_BINARY = "binary_data_size"
_JSON = "application/json"


class ArenaForward:
    """One request's slot: its body in the first ``body_size`` bytes, its
    outputs' span after them. ``header_length``: where its inputs' bytes
    start in the slot; ``doc``: its JSON header when the slot holds only
    those bytes (a request a door parsed itself)."""

    def __init__(self, slot: ArenaSlot, body_size: int, header_length: int, req: InferRequest,
                 doc: dict[str, Any] | None = None) -> None:
        self.slot = slot
        self.header_length = header_length
        self.req = req
        self.doc = doc
        out_at = -(-body_size // 64) * 64
        self.out_offset = slot.offset + out_at
        self.out_size = max(slot.size - out_at, 0)

    def runner_request(self) -> tuple[list[bytes], dict[str, str]]:
        """The body and headers to send a runner that maps the arena."""
        doc = self._header_doc()
        at = self.slot.offset + self.header_length
        for entry in doc["inputs"]:
            parameters = entry.get("parameters")
            if type(parameters) is not dict or _BINARY not in parameters:
                continue
            size = parameters.pop(_BINARY)
            parameters.update({REGION: ARENA_REGION, OFFSET: at, BYTE_SIZE: size})
            at += size
        parameters = doc.setdefault("parameters", {})
        parameters[ARENA_OUTPUTS] = {"offset": self.out_offset, "byte_size": self.out_size}
        self.slot.arena.forwarded += 1
        return [json.dumps(doc, separators=(",", ":")).encode("utf-8")], {"Content-Type": _JSON}

    def _header_doc(self) -> dict[str, Any]:
        if self.doc is not None:   # rewritten in place: each forward gets its own copy
            return {**self.doc, "parameters": dict(self.doc.get("parameters") or {}),
                    "inputs": [{**entry, "parameters": dict(entry.get("parameters") or {})}
                               for entry in self.doc["inputs"]]}
        if self.header_length:   # validated already: parsed again only to be rewritten
            return json.loads(bytes(self.slot.view[:self.header_length]))
        tensor = self.req.inputs[0]   # a raw binary request: its one input is the whole body
        size = len(tensor.data)  # type: ignore[arg-type]  # the body is its data
        return {"inputs": [{"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape,
                            "parameters": {_BINARY: size}}],
                "parameters": {"binary_data_output": True}}

    def client_answer(self, headers: dict[str, str], payload: bytes | bytearray | memoryview,
                      label: str) -> tuple[bytes, list[memoryview]]:
        """A runner's 200 answer as the client gets it: the JSON header and
        the binary parts after it, some views of the slot. ``headers`` is
        updated (header length, content type; named as RunnerResponse
        names them). BadUpstream (502) naming ``label`` when the answer points
        outside the request's output span."""
        view = memoryview(payload)
        length = headers.pop(HEADER_LENGTH, None)
        if length is None:
            end = len(view)
        elif length.isascii() and length.isdigit() and 0 < int(length) <= len(view):
            end = int(length)
        else:
            raise BadUpstream(f"{label} answered {HEADER_LENGTH} {length!r} for a {len(view)}-byte body")
        try:
            doc = json.loads(bytes(view[:end]))
            outputs = doc.get("outputs")
        except (ValueError, AttributeError):
            raise BadUpstream(f"{label} answered an infer request with a header that is not a JSON object") from None
        inline, at = view[end:], 0
        parts: list[memoryview] = []
        for entry in outputs if type(outputs) is list else ():
            parameters = entry.get("parameters") if type(entry) is dict else None
            if type(parameters) is not dict:
                continue
            if parameters.get(REGION) == ARENA_REGION:
                offset, size = parameters.pop(OFFSET, None), parameters.pop(BYTE_SIZE, None)
                del parameters[REGION]
                parts.append(self.output_view(entry.get("name"), entry.get("datatype"), offset, size, label))
                parameters[_BINARY] = size
            elif _BINARY in parameters:
                size = parameters[_BINARY]
                if type(size) is not int or size < 0 or at + size > len(inline):
                    raise BadUpstream(f"{label} answered binary_data_size {size!r} for output "
                                      f"{entry.get('name')!r}, past the end of its body")
                parts.append(inline[at:at + size])
                at += size
        header = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        if parts:
            headers[HEADER_LENGTH] = str(len(header))
            headers["Content-Type"] = "application/octet-stream"
        else:
            headers["Content-Type"] = _JSON
        return header, parts

    def output_view(self, name: object, datatype: object, offset: object, size: object, label: str) -> memoryview:
        """The bytes of an output the runner put in the arena, from the
        request's output span; BadUpstream (502) naming ``label`` for one
        outside it, or for BYTES (their framing is in the answer's body,
        where it is checked)."""
        if datatype == "BYTES":
            raise BadUpstream(f"{label} put BYTES output {name!r} in the arena: BYTES outputs "
                              f"come in the answer's body")
        if not (type(offset) is int and type(size) is int and self.out_offset <= offset
                and size >= 0 and offset + size <= self.out_offset + self.out_size):
            raise BadUpstream(f"{label} put output {name!r} at {offset!r}+{size!r} in the arena, "
                              f"outside the {self.out_size} bytes at {self.out_offset} it was given")
        start = offset - self.slot.offset
        return self.slot.view[start:start + size]
