"""A runner's infer answer is checked against the model's declared outputs
before a client sees it (server/runner_processes/answer_check.py, over
v2/validate.validate_answer): what passes comes with the daemon's own
headers; what does not is a BadUpstream (502) naming the runner and the
fault. Pure: answers made with the v2 codec, then broken on purpose."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cartonstore.errors import BadUpstream, http_status_for
from cartonstore.format.carton_toml import TensorSpec
from cartonstore.server.models.model_config import answer_limit
from cartonstore.server.runner_processes.answer_check import MAX_ERROR_TEXT, checked_answer, walks_little
from cartonstore.server.runner_processes.settings import RunnerResponse
from cartonstore.v2.framing import HEADER_LENGTH, encode_infer_response

OUTPUTS = [TensorSpec("y", "float32", ("batch", 2)), TensorSpec("names", "string", ("batch",))]
LABEL = "runner for m"


def answer(outputs: dict, *, binary: bool = True, **headers: str) -> RunnerResponse:
    parts, length = encode_infer_response(model_name="m", model_version=None, request_id=None, outputs=outputs,
                                          binary=lambda _: binary)
    sent = {"Content-Type": "text/html", "X-Runner": "anything"}
    if length is not None:
        sent[HEADER_LENGTH] = str(length)
    sent.update({k.replace("_", "-"): v for k, v in headers.items()})
    return RunnerResponse(200, sent, b"".join(bytes(p) for p in parts))


def good(**replace: object) -> dict:
    outputs = {"y": np.zeros((3, 2), np.float32), "names": np.array([b"a", b"b", b"c"], dtype=object)}
    outputs.update(replace)
    return {k: v for k, v in outputs.items() if v is not None}


@pytest.mark.parametrize("binary", [True, False])
def test_a_declared_answer_passes_with_the_daemons_headers_alone(binary: bool) -> None:
    sent = answer(good(), binary=binary)
    checked = checked_answer(sent, OUTPUTS, LABEL)
    assert checked.status == 200 and checked.body == sent.body
    if binary:
        assert checked.headers == {"Content-Type": "application/octet-stream",
                                   HEADER_LENGTH: sent.headers[HEADER_LENGTH]}
    else:
        assert checked.headers == {"Content-Type": "application/json"}
    assert checked_answer(answer(good(names=None)), OUTPUTS, LABEL).status == 200   # a subset, as requested


def _tampered(doc_change, binary: bytes | None = None) -> RunnerResponse:
    sent = answer(good())
    length = int(sent.headers[HEADER_LENGTH])
    doc = json.loads(sent.body[:length])
    doc_change(doc)
    header = json.dumps(doc).encode()
    body = header + (sent.body[length:] if binary is None else binary)
    return RunnerResponse(200, {HEADER_LENGTH: str(len(header))}, body)


def _set(path: tuple, value: object) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


BROKEN = [
    (answer(good(extra=np.zeros(1, np.int64))), "output 'extra': is not an output of this model (outputs: 'y', "
                                                "'names')"),
    (answer(good(y=np.zeros((3, 2), np.float64))), "output 'y': datatype is FP64 but the model expects FP32"),
    (answer(good(y=np.zeros((3, 2, 1), np.float32))), "output 'y': shape [3, 2, 1] has rank 3"),
    (answer(good(y=np.zeros((3, 5), np.float32))), "output 'y': shape [3, 5] has 5 in dimension 1"),
    (_tampered(_set(("outputs", 0, "shape"), [4, 2])), "output 'y': binary_data_size 24 does not match shape "
                                                       "[4, 2]"),
    (_tampered(_set(("outputs", 1, "name"), "y")), "output 'y': is given twice"),
    (_tampered(lambda doc: doc.pop("outputs")), '"outputs" is missing'),
    (_tampered(lambda doc: None, binary=b"\x00" * 40), "bytes after the binary data"),
    (_tampered(lambda doc: None, binary=b"\x00" * 3), "runs past the end of the body"),
    (answer(good(), Content_Encoding="gzip"), "answered with Content-Encoding 'gzip': runners must not compress"),
    (RunnerResponse(200, {HEADER_LENGTH: "99"}, b"{}"), "Inference-Header-Content-Length 99 is larger than the "
                                                       "2-byte body"),
    (RunnerResponse(200, {HEADER_LENGTH: "-1"}, b"{}"), "must be a whole number of bytes"),
    (RunnerResponse(200, {}, b"<html>hello</html>"), "JSON is not valid"),
    (RunnerResponse(200, {}, b'{"outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [1]}]}'),
     "output 'y': shape [1, 2] needs 2 elements"),
    (RunnerResponse(302, {}, b""), "answered HTTP status 302, which a v2 server does not answer"),
    (RunnerResponse(101, {}, b""), "answered HTTP status 101"),
    (RunnerResponse(204, {}, b""), "answered HTTP status 204"),
]


@pytest.mark.parametrize("response, message", BROKEN, ids=[m[:40] for _, m in BROKEN])
def test_an_answer_the_declarations_do_not_allow_is_a_502_naming_the_runner(response: RunnerResponse,
                                                                          message: str) -> None:
    with pytest.raises(BadUpstream) as caught:
        checked_answer(response, OUTPUTS, LABEL)
    assert str(caught.value).startswith(LABEL) and message in str(caught.value), str(caught.value)
    assert http_status_for(caught.value) == 502


def test_undeclared_outputs_leave_only_the_answers_own_consistency_to_check() -> None:
    assert checked_answer(answer(good(extra=np.zeros(1, np.int64))), None, LABEL).status == 200
    with pytest.raises(BadUpstream, match="binary_data_size 24 does not match"):
        checked_answer(_tampered(_set(("outputs", 0, "shape"), [4, 2])), None, LABEL)


def test_an_error_answer_keeps_its_status_and_message_as_the_daemons_own_error() -> None:
    sent = RunnerResponse(500, {"Content-Type": "text/html", "Set-Cookie": "a=b"},
                          json.dumps({"error": "the model raised: " + "x" * 10_000}).encode())
    checked = checked_answer(sent, OUTPUTS, LABEL)
    assert checked.status == 500 and checked.headers == {"Content-Type": "application/json"}
    error = json.loads(checked.body)["error"]
    assert error.startswith("the model raised: xxx") and len(error) < MAX_ERROR_TEXT + 100
    assert error.endswith(f"({10_018 - MAX_ERROR_TEXT} more characters)")
    plain = checked_answer(RunnerResponse(400, {}, b"<h1>bad</h1>"), OUTPUTS, LABEL)
    assert json.loads(plain.body) == {"error": "12 byte(s), not a JSON error: <h1>bad</h1>"}


def test_the_answer_limit_is_what_the_declared_outputs_can_hold_or_max_request_size() -> None:
    small = [TensorSpec("y", "float32", (4,))]
    big = [TensorSpec("y", "float32", (1024, 1024)), TensorSpec("z", "int64", (8,))]
    assert answer_limit(small, None, 16 << 20) == 16 << 20
    assert answer_limit(big, None, 16 << 20) == 64 * 1024 + (1024 * 1024 + 8) * 32   # each element in JSON
    assert answer_limit(OUTPUTS, None, 16 << 20) == 16 << 20   # symbolic dimensions: any size
    assert answer_limit([TensorSpec("s", "string", (2,))], None, 1 << 20) == 1 << 20
    assert answer_limit(big, 1 << 20, 16 << 20) == 1 << 20   # runners.max_response_size, when set
    assert answer_limit(None, None, 16 << 20) == 16 << 20


def test_a_big_answer_that_may_name_bytes_is_walked_off_the_event_loop() -> None:
    """Numeric outputs are checked by their sizes, on the loop; BYTES are
    walked element by element, so a big answer that names them, even
    spelled with an escape the JSON parser reads as BYTES, goes to a thread."""
    def big(header: bytes) -> RunnerResponse:
        return RunnerResponse(200, {HEADER_LENGTH: str(len(header))}, header + bytes(1 << 20))
    assert walks_little(big(b'{"outputs": [{"name": "y", "datatype": "FP32"}]}'))
    assert not walks_little(big(b'{"outputs": [{"name": "y", "datatype": "BYTES"}]}'))
    escaped = b'{"outputs": [{"name": "y", "datatype": "BYT\\u0045S"}]}'
    assert json.loads(escaped)["outputs"][0]["datatype"] == "BYTES"
    assert not walks_little(big(escaped))
    assert walks_little(RunnerResponse(200, {}, escaped))   # small: walked on the loop, whatever it names


def test_an_error_answer_nested_past_any_parser_is_named_not_a_crash() -> None:
    nested = b'{"error": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    checked = checked_answer(RunnerResponse(500, {}, nested), OUTPUTS, LABEL)
    assert checked.status == 500
    assert json.loads(checked.body)["error"].startswith(f"{len(nested)} byte(s), not a JSON error:")


def test_bytes_outputs_in_the_arena_are_a_502() -> None:
    """BYTES framing is checked in the answer's body; a runner that puts
    BYTES in its arena span (where nothing walks them) is refused."""
    from cartonstore.runner.protocol import ARENA_REGION
    from cartonstore.server.tensors.arena import TensorArena
    from cartonstore.server.tensors.arena_wire import ArenaForward
    from cartonstore.v2.shared_memory import BYTE_SIZE, OFFSET, REGION

    arena = TensorArena(1 << 20)
    try:
        slot = arena.take(8192)
        forward = ArenaForward(slot, 4096, 100, None)   # type: ignore[arg-type]  # the request is not read here
        entry = {"name": "names", "datatype": "BYTES", "shape": [1],
                 "parameters": {REGION: ARENA_REGION, OFFSET: forward.out_offset, BYTE_SIZE: 8}}
        header = json.dumps({"outputs": [entry]}).encode()
        with pytest.raises(BadUpstream, match="put BYTES output 'names' in the arena"):
            forward.client_answer({HEADER_LENGTH: str(len(header))}, header, LABEL)
        entry["datatype"] = "FP32"   # two FP32 elements there: passed on from the slot
        header = json.dumps({"outputs": [entry]}).encode()
        out_headers = {HEADER_LENGTH: str(len(header))}
        _, parts = forward.client_answer(out_headers, header, LABEL)
        assert [len(p) for p in parts] == [8] and out_headers["Content-Type"] == "application/octet-stream"
        slot.release()
    finally:
        arena.close()
