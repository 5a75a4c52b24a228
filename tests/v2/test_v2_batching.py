"""v2/batching.py, the pure half of dynamic batching: which requests may be
joined (batch_key), the joined request as a runner parses it, and the
answer cut back into each request's rows and framed as each asked."""

from __future__ import annotations

import numpy as np
import pytest

from cartonstore.v2.batching import answers_for, batch_key, joined_request, rows, split_outputs
from cartonstore.v2.encode import encode_infer_request
from cartonstore.v2.framing import parse_infer_request, parse_infer_response, tensor_to_numpy
from cartonstore.v2.validate import validate_request
from cartonstore.v2.wire_types import InferRequest


def _request(inputs: dict, *, binary: bool = True, outputs: list[str] | None = None, binary_outputs: bool = True,
             request_id: str | None = None, parameters: dict | None = None) -> InferRequest:
    parts, length = encode_infer_request(inputs, binary=binary, outputs=outputs, binary_outputs=binary_outputs,
                                         request_id=request_id, parameters=parameters)
    req = parse_infer_request(b"".join(bytes(p) for p in parts), length)
    validate_request(req, None, None)   # leaves JSON data flat, as the daemon's check does
    return req


def _x(n: int, k: int = 3, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n * k, dtype=np.float32).reshape(n, k)


def test_requests_that_differ_only_in_rows_and_framing_share_a_key() -> None:
    base = batch_key(_request({"x": _x(1), "ids": np.array([1])}))
    assert batch_key(_request({"x": _x(4), "ids": np.arange(4)}, binary=False, binary_outputs=False)) == base
    assert batch_key(_request({"x": _x(1, 4), "ids": np.array([1])})) != base                    # other dims
    assert batch_key(_request({"ids": np.array([1]), "x": _x(1)})) != base                      # other order
    assert batch_key(_request({"x": _x(1).astype(np.float64), "ids": np.array([1])})) != base   # other dtype
    assert batch_key(_request({"x": _x(1), "ids": np.array([1])}, parameters={"p": 1})) != base
    assert batch_key(_request({"x": _x(1), "ids": np.array([1])}, outputs=["y"])) != base
    assert batch_key(_request({"x": _x(1), "ids": np.array([1])}, outputs=["y"], binary_outputs=False)) == \
        batch_key(_request({"x": _x(2), "ids": np.array([1, 2])}, outputs=["y"]))


def test_the_joined_request_holds_every_row_in_order() -> None:
    words = np.array([b"a", b"bc"], dtype=object)
    reqs = [_request({"x": _x(1), "w": words[:1]}),
            _request({"x": _x(2, start=10), "w": words}, binary=False),   # JSON data: packed
            _request({"x": _x(1, start=90), "w": words[1:]})]
    assert [rows(r) for r in reqs] == [1, 2, 1]
    parts, length = joined_request(reqs)
    joined = parse_infer_request(b"".join(bytes(p) for p in parts), length)
    x, w = (tensor_to_numpy(t) for t in joined.inputs)
    np.testing.assert_array_equal(x, np.concatenate([_x(1), _x(2, start=10), _x(1, start=90)]))
    assert w.tolist() == [b"a", b"a", b"bc", b"bc"]
    assert joined.binary_data_output is True


def test_answers_are_cut_back_and_framed_as_each_asked() -> None:
    reqs = [_request({"x": _x(2)}, request_id="one"), _request({"x": _x(1)}, binary_outputs=False)]
    y = np.arange(6, dtype=np.float32).reshape(3, 2)
    tags = np.array([b"p", b"q", b"r"], dtype=object)
    doc = {"model_name": "m", "model_version": "v1"}
    (first, first_length), (second, second_length) = answers_for(reqs, doc, {"y": y, "tag": tags}, "m")
    assert first_length is not None and second_length is None   # binary, then all JSON
    got_doc, got = parse_infer_response(b"".join(bytes(p) for p in first), first_length)
    assert got_doc["id"] == "one" and got_doc["model_version"] == "v1"
    np.testing.assert_array_equal(got["y"], y[:2])
    assert got["tag"].tolist() == [b"p", b"q"]
    got_doc, got = parse_infer_response(b"".join(bytes(p) for p in second), None)
    assert "id" not in got_doc
    np.testing.assert_array_equal(got["y"], y[2:])


@pytest.mark.parametrize("array,words", [
    (np.zeros((2, 2)), "output 'y' of a batch of 3 has shape [2, 2]"),
    (np.float32(1.0).reshape(()), "output 'y' of a batch of 3 has shape []"),
])
def test_an_output_without_a_row_per_request_cannot_be_cut(array: np.ndarray, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        split_outputs({"y": array}, [2, 1])
