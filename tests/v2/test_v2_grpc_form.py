"""gRPC's ModelInferRequest taken straight to the parsed v2 request the
inference core checks (no JSON header built and parsed back), and a
parsed runner answer made into a ModelInferResponse."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from cartonstore.errors import InvalidInput
from cartonstore.v2.binary_form import encoded_doc, runner_doc
from cartonstore.v2.framing import parse_infer_answer, parse_infer_request
from cartonstore.v2.grpc_form import request_of, response_of


def _request() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", id="r1")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 3])
    req.inputs.add(name="s", datatype="FP32", shape=[2], parameters={
        "shared_memory_region": pb.InferParameter(string_param="mine"),
        "shared_memory_byte_size": pb.InferParameter(int64_param=8)})
    req.outputs.add(name="y")
    req.raw_input_contents.append(np.arange(3, dtype=np.float32).tobytes())
    return req


def test_raw_contents_become_tensor_views_and_the_runner_header_parses_as_http_would() -> None:
    message = _request()
    req = request_of(message)
    x, s = req.inputs
    assert isinstance(x.data, memoryview) and x.data == message.raw_input_contents[0]
    assert s.data is None and s.shm.region == "mine"
    assert req.outputs[0].binary is True and req.binary_data_output and req.id == "r1"
    header = encoded_doc(runner_doc(req, {"mine": "runner-name"}))
    again = parse_infer_request(header + bytes(x.data), len(header))
    assert [t.name for t in again.inputs] == ["x", "s"]
    assert again.inputs[1].shm.region == "runner-name"
    assert np.frombuffer(again.inputs[0].data, np.float32).tolist() == [0, 1, 2]


@pytest.mark.parametrize(("change", "problem"), [
    (lambda r: r.inputs[0].parameters["binary_data_size"].CopyFrom(pb.InferParameter(int64_param=12)),
     "belongs to the HTTP binary tensor form"),
    (lambda r: r.raw_input_contents.append(b"more"), "raw_input_contents has 2 entries for 1 input"),
    (lambda r: setattr(r.inputs[0], "datatype", "FP31"), "unknown datatype 'FP31'"),
    (lambda r: r.outputs.add(name="y"), "is requested twice"),
])
def test_a_malformed_message_is_refused_naming_its_problem(change, problem) -> None:
    message = _request()
    change(message)
    with pytest.raises(InvalidInput, match=problem):
        request_of(message)


def test_a_parsed_answer_becomes_a_response() -> None:
    values = np.array([1.5, 2.5], dtype=np.float32)
    head = json.dumps({"model_name": "m", "id": "r1", "outputs": [
        {"name": "y", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
        {"name": "z", "datatype": "INT64", "shape": [1], "data": [7]}]}).encode()
    doc, outputs = parse_infer_answer(head + values.tobytes(), len(head))
    resp = response_of(doc, outputs)
    assert (resp.model_name, resp.id) == ("m", "r1")
    assert [o.name for o in resp.outputs] == ["y", "z"] and not resp.outputs[0].parameters
    assert np.frombuffer(resp.raw_output_contents[0], np.float32).tolist() == [1.5, 2.5]
    assert np.frombuffer(resp.raw_output_contents[1], np.int64).tolist() == [7]
