"""Triton's response cache: a model version's answers kept by what was
asked of it, so the same request again is answered without its runner.

The key is a sha256 over a canonical encoding of what reaches the model:
its name and version (the manifest hash), each input's name, datatype,
shape, parameters and bytes (inputs by name: their order means nothing),
the outputs asked for with their parameters, the request's parameters.
Left out: the request id, and the HTTP binary form's own parameters
(v2/grpc_form.py's HTTP_ONLY), which say how tensors travel, not what they
are; so an HTTP JSON request, its binary twin and its gRPC twin share an
entry. The value is the runner's answer before a door shapes it: each
output's bytes in binary tensor form, copied out of the answer, re-encoded
for each caller as it asks (JSON or binary over HTTP, raw contents over
gRPC) with the new request's id.

Bounded by [cache] size bytes, least recently used first out; an answer
bigger than the whole cache is not kept. An entry counts its outputs'
bytes and ENTRY_OVERHEAD. The pipeline keeps only answers of a model
version that still serves, and the service drops a name's entries when
the version it serves changes or it is unloaded. On the event loop only.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cartonstore.v2 import json_codec
from cartonstore.v2.binary_form import tensor_bytes
from cartonstore.v2.grpc_form import HTTP_ONLY
from cartonstore.v2.tensors import tensor_to_numpy, to_binary
from cartonstore.v2.wire_types import InferRequest, WireTensor

ENTRY_OVERHEAD = 256   # bytes an entry counts beyond its outputs' data: its key, header fields, bookkeeping
# measured (bench_response_cache.py, a loaded 2-core host): sha256 of 64 KiB ~50 us inline, 256 KiB 300-470 us;
# a thread hop 200-450 us. Up to 64 KiB the event loop is held less than a hop would take; beyond, a thread.
HASH_IN_THREAD_FROM = 64 * 1024
_ANSWER_FIELDS = ("model_name", "model_version", "parameters")   # of the runner's header, kept with the outputs


@dataclass(frozen=True, slots=True)
class CachedOutput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: dict[str, Any]
    data: bytes   # binary tensor data


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    """A runner's 200 answer as the cache keeps it."""

    model: str
    header: dict[str, Any]   # the runner's header fields beside its outputs and id
    outputs: tuple[CachedOutput, ...]

    @property
    def size(self) -> int:
        return ENTRY_OVERHEAD + sum(len(out.data) for out in self.outputs)

    def answer_doc(self, request_id: str | None) -> dict[str, Any]:
        """The answer's header fields for a request of ``request_id``."""
        return {**self.header, "id": request_id} if request_id else dict(self.header)

    def tensors(self) -> list[WireTensor]:
        """The outputs as a door encodes them: fresh tensors over the kept bytes."""
        return [WireTensor(out.name, out.datatype, list(out.shape), dict(out.parameters), memoryview(out.data),
                           role="output") for out in self.outputs]


class ResponseCache:
    """The daemon's answers, least recently used first out, within
    ``capacity`` bytes (0: no cache)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, CachedAnswer] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> CachedAnswer | None:
        answer = self._entries.get(key)
        if answer is not None:
            self._entries.move_to_end(key)
        return answer

    def put(self, key: bytes, answer: CachedAnswer) -> bool:
        """Keep ``answer``, evicting the least recently used until it fits;
        False (nothing kept or evicted) for one bigger than the cache."""
        size = answer.size
        if size > self.capacity:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used -= old.size
        while self.used + size > self.capacity:
            _, evicted = self._entries.popitem(last=False)
            self.used -= evicted.size
            self.evictions += 1
        self._entries[key] = answer
        self.used += size
        return True

    def figures(self) -> dict[str, int]:
        """What /metrics shows: plain ints, read from any thread."""
        return {"capacity": self.capacity, "bytes": self.used, "entries": len(self._entries),
                "evictions": self.evictions}

    def drop(self, model: str) -> None:
        """Forget every answer of ``model`` (any version)."""
        for key in [key for key, answer in self._entries.items() if answer.model == model]:
            self.used -= self._entries.pop(key).size


def request_key(model: str, version: str, req: InferRequest) -> bytes:
    """The sha256 of what ``req`` asks of the model version (the module's
    docstring says what counts). ``req`` passed validate_request and names
    no shared memory."""
    inputs = sorted(req.inputs, key=lambda t: t.name)
    outputs = None if req.outputs is None else [[out.name, _meaningful(out.parameters)] for out in req.outputs]
    head = json_codec.dumps({"model": model, "version": version, "parameters": _meaningful(req.parameters),
                             "inputs": [[t.name, t.datatype, t.shape, _meaningful(t.parameters)] for t in inputs],
                             "outputs": outputs}, exact=False)
    digest = hashlib.sha256(len(head).to_bytes(8, "little"))
    digest.update(head)
    for tensor in inputs:
        data = tensor_bytes(tensor)
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.digest()


async def request_key_off_loop(model: str, version: str, req: InferRequest) -> bytes:
    """request_key, in a thread for a request of many bytes."""
    if _bytes_of(req.inputs) < HASH_IN_THREAD_FROM:
        return request_key(model, version, req)
    return await asyncio.to_thread(request_key, model, version, req)


def _bytes_of(tensors: Sequence[WireTensor]) -> int:
    """About how many bytes hashing or copying ``tensors`` walks (a JSON element: 8)."""
    return sum(len(t.data) if t.data is not None else 8 * len(t.json_data or ()) for t in tensors)


def _meaningful(parameters: dict[str, Any]) -> dict[str, Any]:
    """Parameters as they matter to the model: without the HTTP binary form's own."""
    return {key: value for key, value in sorted(parameters.items()) if key not in HTTP_ONLY}


def cached_answer(model: str, doc: dict[str, Any], outputs: Sequence[WireTensor]) -> CachedAnswer:
    """A checked 200 answer as the cache keeps it: each output's bytes
    copied (binary or JSON as the runner sent it, kept binary)."""
    kept = []
    for out in outputs:
        data = out.data if out.data is not None else to_binary(out.what, tensor_to_numpy(out), out.datatype)
        kept.append(CachedOutput(out.name, out.datatype, tuple(out.shape), _meaningful(out.parameters), bytes(data)))
    return CachedAnswer(model, {k: doc[k] for k in _ANSWER_FIELDS if k in doc}, tuple(kept))


async def cached_answer_off_loop(model: str, doc: dict[str, Any], outputs: Sequence[WireTensor]) -> CachedAnswer:
    """cached_answer, in a thread for an answer of many bytes."""
    if _bytes_of(outputs) < HASH_IN_THREAD_FROM:
        return cached_answer(model, doc, outputs)
    return await asyncio.to_thread(cached_answer, model, doc, outputs)
