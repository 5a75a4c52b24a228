"""JSON "data" inputs reach a runner as binary tensor data: the daemon has
parsed and checked them, so the runner never parses them again (issue 9
§4: JSON throughput). Seen from a third-party runner of our own that
answers with exactly what it received, and end to end with tritonclient."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton
from conftest import short_dir
from kit.daemonkit import DaemonProcess, wait_for
from kit.inferkit import echo_carton, runner_pids, third_party_config, third_party_runner
from test_infer_api import _load, raw_post

# A v2 server that answers each infer with what it got (its headers and the parsed JSON header) beside an
# empty "outputs", the one field the daemon holds an answer to (the carton declares no outputs).
RECORDER = third_party_runner(r'''
async def infer(request):
    body = await request.read()
    length = request.headers.get("Inference-Header-Content-Length")
    header = json.loads(body[:int(length)] if length else body)
    return web.json_response({"outputs": [], "content_type": request.headers.get("Content-Type"),
                              "header_length": length,
                              "header": header, "binary": body[int(length):].hex() if length else ""})
''')

RECORDED_TOML = '''spec_version = 1
model_name = "rec"
[[input]]
name = "a"
dtype = "float32"
shape = [2]
[[input]]
name = "b"
dtype = "int16"
shape = [3]
[[input]]
name = "s"
dtype = "string"
shape = [2]
[runner]
runner_name = "recorder"
required_framework_version = "1"
runner_compat_version = 1
'''


@pytest.fixture(scope="module")
def served() -> Iterator[DaemonProcess]:
    with short_dir() as base:
        config = third_party_config(base, "recorder", RECORDER, ["{socket}"])
        (base / "rec").mkdir()
        (base / "rec" / "carton.toml").write_text(RECORDED_TOML)
        d = DaemonProcess(base / "root", extra_args=["--config", str(config)]).start()
        try:
            _load(d, "rec", base / "rec")
            _load(d, "echo", echo_carton(base / "echo", dtypes=["float32", "int64", "string"]))
            yield d
        finally:
            d.stop()
        assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)


def _recorded(d: DaemonProcess, doc: dict, binary: bytes = b"") -> dict:
    header = json.dumps(doc).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))} if binary else {}
    status, _, body = raw_post(d, "/v2/models/rec/infer", header + binary, headers)
    assert status == 200, body
    return json.loads(body)


def test_the_runner_gets_binary_bytes_in_the_order_of_the_inputs(served: DaemonProcess) -> None:
    b = np.array([1, -2, 3], dtype=np.int16)
    got = _recorded(served, {
        "id": "q7", "parameters": {"binary_data_output": False, "mine": 2},
        "inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "data": [[1.5], [-0.25]]},
                   {"name": "b", "datatype": "INT16", "shape": [3], "parameters": {"binary_data_size": 6}},
                   {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["x:y", "é"]}],
        "outputs": [{"name": "o", "parameters": {"binary_data": True}}]}, b.tobytes())
    assert got["content_type"] == "application/octet-stream"
    header = got["header"]
    assert int(got["header_length"]) > 0
    assert header["id"] == "q7" and header["parameters"] == {"binary_data_output": False, "mine": 2}
    assert header["outputs"] == [{"name": "o", "parameters": {"binary_data": True}}]
    assert [e.get("data") for e in header["inputs"]] == [None, None, None]
    assert [e["parameters"]["binary_data_size"] for e in header["inputs"]] == [8, 6, 4 + 3 + 4 + 2]
    want = (np.array([1.5, -0.25], np.float32).tobytes() + b.tobytes()
            + (3).to_bytes(4, "little") + b"x:y" + (2).to_bytes(4, "little") + "é".encode())
    assert bytes.fromhex(got["binary"]) == want


def test_a_binary_request_reaches_the_runner_as_it_came(served: DaemonProcess) -> None:
    data = np.array([1.5, 2.5], np.float32).tobytes() + np.arange(3, dtype=np.int16).tobytes() + \
        (1).to_bytes(4, "little") + b"p" + (0).to_bytes(4, "little")
    doc = {"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
                      {"name": "b", "datatype": "INT16", "shape": [3], "parameters": {"binary_data_size": 6}},
                      {"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 9}}]}
    got = _recorded(served, doc, data)
    assert got["header"] == doc and bytes.fromhex(got["binary"]) == data


@pytest.mark.parametrize("bad,problem", [
    ([1.5, True], "element 1 is a boolean"),
    ([1.5, "2"], "element 1 is a string"),
    ([1.5], "needs 2 elements"),
])
def test_bad_json_data_is_refused_before_the_runner(served: DaemonProcess, bad: list, problem: str) -> None:
    doc = {"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "data": bad},
                      {"name": "b", "datatype": "INT16", "shape": [3], "data": [1, 2, 3]},
                      {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["x", "y"]}]}
    status, _, body = raw_post(served, "/v2/models/rec/infer", json.dumps(doc).encode(), {})
    assert status == 400 and "input 'a'" in json.loads(body)["error"] and problem in json.loads(body)["error"]


def test_tritonclient_json_in_and_out_through_the_binary_form(served: DaemonProcess) -> None:
    values = {"x_float32": np.array([[0.1, -3.4e38], [np.float32(1) / 3, 7]], dtype=np.float32),
              "x_int64": np.array([[2**62, -(2**63)], [0, 1]], dtype=np.int64),
              "x_string": np.array([["a:b"], ["ü"]], dtype=object)}
    c = triton.InferenceServerClient(served.host_port)
    try:
        inputs = []
        for name, value in values.items():
            i = triton.InferInput(name, list(value.shape), triton.np_to_triton_dtype(value.dtype))
            i.set_data_from_numpy(value, binary_data=False)
            inputs.append(i)
        outputs = [triton.InferRequestedOutput("y" + n[1:], binary_data=False) for n in values]
        result = c.infer("echo", inputs, outputs=outputs)
    finally:
        c.close()
    for name, value in values.items():
        got = result.as_numpy("y" + name[1:])
        if value.dtype == object:
            assert [e.decode() if isinstance(e, bytes) else e for e in got.reshape(-1)] == list(value.reshape(-1))
        else:
            assert got.dtype == value.dtype and np.array_equal(got, value), name
