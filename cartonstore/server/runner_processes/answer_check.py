"""A runner's answer to an infer request, checked before a client sees it.

A runner runs the carton's code, so its answer is as hostile as a
request: its outputs must be ones the model declares, in their declared
datatypes and ranks, their data filling their shapes; its framing must
hold (Inference-Header-Content-Length within the body, binary sizes adding
up to the rest). The daemon passes on only the protocol's own headers and
sets them itself; a runner never compresses (the daemon compresses for its
clients), so an answer with a Content-Encoding is refused. An error answer
passes on its status (one a v2 server may give) and its message, cut to
MAX_ERROR_TEXT, as the daemon's own {"error": ...}; any other status is
the runner's fault. Whatever is refused is a BadUpstream (502) naming the
runner and what was wrong.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cartonstore.errors import BadUpstream, InvalidInput
from cartonstore.format.carton_toml import TensorSpec
from cartonstore.v2.error_body import error_text
from cartonstore.v2.framing import HEADER_LENGTH, header_length, parse_infer_answer, surely_plain
from cartonstore.v2.validate import validate_answer
from cartonstore.v2.wire_types import WireTensor

from .settings import RunnerResponse

ERROR_STATUSES = frozenset({400, 404, 409, 413, 422, 429, 500, 503})   # what a v2 server answers for a failure
MAX_ERROR_TEXT = 4096
IN_THREAD_FROM = 256 * 1024   # answers whose JSON or BYTES take this many bytes to walk are checked in a thread
_JSON = "application/json"
BYTES = b'"BYTES"'
_BINARY = "application/octet-stream"


@dataclass(slots=True)
class ParsedAnswer:
    """A runner's 200 answer as its check parsed it: the JSON header and
    its outputs (binary data as views of the answer's body)."""

    doc: dict[str, Any]
    outputs: list[WireTensor]


def checked_answer(response: RunnerResponse, outputs: Sequence[TensorSpec] | None, label: str) -> RunnerResponse:
    """The answer a client may be given for ``response`` from the runner
    ``label`` ("runner for <model>"): its body as it came (a 200's) or the
    runner's message as the daemon's error, and only the headers the
    daemon sets. BadUpstream for anything else."""
    return checked_and_parsed(response, outputs, label)[0]


def checked_and_parsed(response: RunnerResponse, outputs: Sequence[TensorSpec] | None,
                       label: str) -> tuple[RunnerResponse, ParsedAnswer | None]:
    """checked_answer, with what the check parsed of a 200 (None for an error)."""
    if response.status != 200:
        return _error_answer(response, label), None
    coding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if coding not in ("", "identity"):
        raise BadUpstream(f"{label} answered with Content-Encoding {coding[:40]!r}: runners must not compress "
                          f"their answers (the daemon compresses for its clients)")
    try:
        length = header_length(response.headers.get(HEADER_LENGTH))
        doc, tensors = parse_infer_answer(response.body, length)
        validate_answer(tensors, outputs)
    except InvalidInput as e:
        raise BadUpstream(f"{label} answered what the model's declarations do not allow, so it was not passed "
                          f"on: {e}") from None
    headers = {"Content-Type": _JSON if length is None else _BINARY}
    if length is not None:
        headers[HEADER_LENGTH] = str(length)
    return RunnerResponse(200, headers, response.body, response.arena, response.timing), ParsedAnswer(doc, tensors)


async def checked_answer_off_loop(response: RunnerResponse, outputs: Sequence[TensorSpec] | None,
                                  label: str) -> tuple[RunnerResponse, ParsedAnswer | None]:
    """checked_and_parsed, in a thread when walking the answer would hold
    the event loop a while (a big JSON answer, or BYTES in a big binary one)."""
    if walks_little(response):
        return checked_and_parsed(response, outputs, label)
    return await asyncio.to_thread(checked_and_parsed, response, outputs, label)


def walks_little(response: RunnerResponse) -> bool:
    body = response.body
    if response.status != 200 or len(body) < IN_THREAD_FROM:
        return True
    length = response.headers.get(HEADER_LENGTH)
    if length is None or not (length.isascii() and length.isdigit()) or int(length) >= IN_THREAD_FROM:
        return False
    return surely_plain(bytes(memoryview(body)[:int(length)]), BYTES)


def _error_answer(response: RunnerResponse, label: str) -> RunnerResponse:
    if response.status not in ERROR_STATUSES:
        raise BadUpstream(f"{label} answered HTTP status {response.status}, which a v2 server does not answer "
                          f"an infer request with")
    text = error_text(response.body)
    if len(text) > MAX_ERROR_TEXT:
        text = text[:MAX_ERROR_TEXT] + f"... ({len(text) - MAX_ERROR_TEXT} more characters)"
    body = json.dumps({"error": text}).encode()
    return RunnerResponse(response.status, {"Content-Type": _JSON}, body, False, response.timing)
