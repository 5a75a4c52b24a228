"""Decoupled models (many responses to one request) behind a real daemon
and real python runners, through stock tritonclient.grpc's stream API, as
Triton's simple_grpc_custom_repeat.py drives its repeat_int32 model: each
response with triton_final_response, the empty final one when asked; the
config read back says decoupled; a one-response infer of it is refused by
name; a runner that breaks its stream's framing is a named error and the
stream goes on; a client that stops reading stops the model (what is
queued between them stays bounded). Triton's generate extension over HTTP:
generate_stream read as server-sent events with a plain HTTP client,
generate's one answer, for a decoupled model and any other."""

from __future__ import annotations

import http.client
import json
import os
import queue
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
from conftest import short_dir
from kit.daemonkit import DaemonProcess, wait_for
from kit.hostile_answers import TAKE_THE_CONNECTION
from kit.inferkit import echo_carton, repeat_carton, runner_pids
from tritonclient.utils import InferenceServerException

from cartonstore.cli.commands import main

pytestmark = pytest.mark.xdist_group("decoupled")


REPEAT = '''
import numpy as np


class Repeat:
    def infer_stream_with_tensors(self, tensors):
        for i, value in enumerate(tensors["IN"]):
            yield {"OUT": np.array([value], np.int32), "IDX": np.array([i], np.uint32)}


def get_model():
    return Repeat()
'''

# IN = [n]: n responses of 256 KiB, the count made so far written to COUNT before each is yielded
FLOOD = '''
import numpy as np

COUNT = {count!r}
BLOCK = np.zeros(256 * 1024, np.uint8)


class Flood:
    def infer_stream_with_tensors(self, tensors):
        for i in range(int(tensors["IN"][0])):
            with open(COUNT, "w") as f:
                f.write(str(i + 1))
            yield {{"OUT": BLOCK, "IDX": np.array([i], np.uint32)}}


def get_model():
    return Flood()
'''

# IN = [mode]: one good response, then the runner's connection is taken over and written as an attacker would
BROKEN = TAKE_THE_CONNECTION + r'''
import json
import struct

import numpy as np


class Broken:
    def infer_stream_with_tensors(self, tensors):
        mode = int(tensors["IN"][0])
        yield {"OUT": np.array([1], np.int32), "IDX": np.array([0], np.uint32)}
        conn = connection()
        if mode == 1:     # a frame claiming 1 GiB
            conn.sendall(struct.pack(">II", 100, 1 << 30) + b"{")
        elif mode == 2:   # a frame whose JSON header is not JSON
            conn.sendall(struct.pack(">II", 5, 0) + b"nope!")
        elif mode == 3:   # an output the carton does not declare
            doc = json.dumps({"outputs": [{"name": "SECRET", "datatype": "INT32", "shape": [1],
                                           "parameters": {"binary_data_size": 4}}]}).encode()
            conn.sendall(struct.pack(">II", len(doc), 4) + doc + b"\0\0\0\0")
        elif mode == 5:   # parameters that are no object
            doc = json.dumps({"outputs": [], "parameters": ["triton_final_response"]}).encode()
            conn.sendall(struct.pack(">II", len(doc), 0) + doc)
        # mode 4: the connection ends before the final frame
        conn.shutdown(socket.SHUT_RDWR)
        yield {"OUT": np.array([2], np.int32), "IDX": np.array([1], np.uint32)}


def get_model():
    return Broken()
'''


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[DaemonProcess, Path]]:
    """One daemon, gRPC on its Unix socket, HTTP on a loopback port, loads
    on demand; models repeat, flood, broken (decoupled) and echo (one
    response) loaded, ondemand (decoupled) only in the store."""
    with short_dir() as base:
        count = base / "flood.count"
        (base / "cartonstore.toml").write_text("[runners]\nload_on_demand = true\n")
        d = DaemonProcess(base / "root", extra_args=["--config", str(base / "cartonstore.toml")]).start()
        try:
            for name, main_py, dtype, length in (("repeat", REPEAT, "int32", 1),
                                                  ("flood", FLOOD.format(count=str(count)), "uint8", 256 * 1024),
                                                  ("broken", BROKEN, "int32", 1), ("ondemand", REPEAT, "int32", 1),
                                                  ("generated", REPEAT, "int32", 1)):
                src = repeat_carton(base / "src" / name, name, main_py, dtype, length)
                assert main(["add", str(src), "--name", name, "--root", str(d.root), "--progress", "none"]) == 0
            echo = echo_carton(base / "src" / "echo", dtypes=["int32", "string"])
            assert main(["add", str(echo), "--name", "echo", "--root", str(d.root), "--progress", "none"]) == 0
            for stored_only in ("echo2", "echo3"):
                assert main(["add", str(echo), "--name", stored_only, "--root", str(d.root), "--progress",
                             "none"]) == 0
            c = tg.InferenceServerClient(d.grpc_unix)
            for name in ("repeat", "flood", "broken", "echo"):
                c.load_model(name)
            c.close()
            yield d, count
        finally:
            d.stop()
            assert not runner_pids(d.root)


def _in(values: list[int]) -> list[tg.InferInput]:
    tensor = tg.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, np.int32))
    return [tensor]


def _final(result: tg.InferResult) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def test_each_request_gets_its_responses_then_the_empty_final_one(served: tuple[DaemonProcess, Path]) -> None:
    d, _ = served
    c = tg.InferenceServerClient(d.grpc_unix)
    answers: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        values = {"a": list(range(100, 110)), "b": list(range(-5, 5)), "c": list(range(7, 17))}
        for rid, data in values.items():
            c.async_stream_infer("repeat", _in(data), request_id=rid, enable_empty_final_response=rid != "c")
        got: dict[str, list[tg.InferResult]] = {rid: [] for rid in values}
        while len(got["a"]) < 11 or len(got["b"]) < 11 or len(got["c"]) < 10:
            result, error = answers.get(timeout=30)
            assert error is None, error
            got[result.get_response().id].append(result)
    finally:
        c.stop_stream()
        c.close()
    for rid, data in values.items():
        responses = got[rid]
        assert [_final(r) for r in responses[:10]] == [False] * 10
        assert [int(r.as_numpy("OUT")[0]) for r in responses[:10]] == data
        assert [int(r.as_numpy("IDX")[0]) for r in responses[:10]] == list(range(10))
        if rid != "c":   # asked for the empty final response: no outputs, the flag true
            assert _final(responses[10]) and not responses[10].get_response().outputs
    assert answers.empty()


def test_a_decoupled_model_loaded_on_demand_by_a_stream_streams(served: tuple[DaemonProcess, Path]) -> None:
    d, _ = served
    c = tg.InferenceServerClient(d.grpc_unix)
    answers: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        c.async_stream_infer("ondemand", _in(list(range(10))), request_id="x", enable_empty_final_response=True)
        c.async_stream_infer("echo", _echo_in(), request_id="y")   # and one that answers once, after it
        got = [answers.get(timeout=60) for _ in range(12)]
    finally:
        c.stop_stream()
        c.close()
    assert all(error is None for _, error in got), got
    assert [int(r.as_numpy("OUT")[0]) for r, _ in got[:10]] == list(range(10))
    assert _final(got[10][0]) and got[10][0].get_response().id == "x"
    assert got[11][0].get_response().id == "y" and got[11][0].as_numpy("y_int32").tolist() == [[3]]


def _echo_in() -> list[tg.InferInput]:
    a = tg.InferInput("x_int32", [1, 1], "INT32")
    a.set_data_from_numpy(np.array([[3]], np.int32))
    b = tg.InferInput("x_string", [1, 1], "BYTES")
    b.set_data_from_numpy(np.array([[b"x"]], dtype=object))
    return [a, b]


def test_each_response_counts_in_response_stats_by_its_index(served: tuple[DaemonProcess, Path]) -> None:
    d, _ = served
    c = tg.InferenceServerClient(d.grpc_unix)
    answers: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        before = c.get_inference_statistics("repeat", as_json=True)["model_stats"][0].get("response_stats", {})
        c.async_stream_infer("repeat", _in([1, 2, 3]), request_id="s")
        assert all(answers.get(timeout=30)[1] is None for _ in range(3))
        stats = c.get_inference_statistics("repeat", as_json=True)["model_stats"][0]
    finally:
        c.stop_stream()
        c.close()
    counts = {k: int(v["success"].get("count", 0)) - int(before.get(k, {}).get("success", {}).get("count", 0))
              for k, v in stats["response_stats"].items()}
    assert {k: counts.get(k) for k in ("0", "1", "2")} == {"0": 1, "1": 1, "2": 1}, stats["response_stats"]
    assert int(stats["response_stats"]["0"]["compute_infer"]["ns"]) > 0


def test_a_load_saying_decoupled_of_a_runner_that_answers_once_is_refused(served: tuple[DaemonProcess, Path]) -> None:
    d, _ = served
    c = tg.InferenceServerClient(d.grpc_unix)
    try:
        with pytest.raises(InferenceServerException, match=r"model_transaction_policy says 'echo2' is decoupled"):
            c.load_model("echo2", config=json.dumps({"model_transaction_policy": {"decoupled": True}}))
        assert not c.is_model_ready("echo2")
    finally:
        c.close()


def test_config_says_decoupled_and_a_plain_infer_is_refused(served: tuple[DaemonProcess, Path]) -> None:
    d, _ = served
    c = tg.InferenceServerClient(d.grpc_unix)
    try:
        assert c.get_model_config("repeat").config.model_transaction_policy.decoupled
        with pytest.raises(InferenceServerException) as refused:
            c.infer("repeat", _in([1, 2]))
        assert "decoupled" in refused.value.message() and "StatusCode.INVALID_ARGUMENT" in refused.value.status()
    finally:
        c.close()


@pytest.mark.parametrize(("mode", "words"), [
    (1, "over its limit"), (2, "not JSON"), (3, "SECRET"), (4, "before its final response"),
    (5, "whose parameters are not an object")])
def test_a_broken_stream_is_named_and_the_stream_goes_on(served: tuple[DaemonProcess, Path], mode: int,
                                                         words: str) -> None:
    d, _ = served
    c = tg.InferenceServerClient(d.grpc_unix)
    answers: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        c.async_stream_infer("broken", _in([mode]), request_id="bad")
        c.async_stream_infer("repeat", _in([4, 5]), request_id="after", enable_empty_final_response=True)
        first, error = answers.get(timeout=30)
        assert error is None and int(first.as_numpy("OUT")[0]) == 1
        _, error = answers.get(timeout=30)
        assert error is not None and "runner for broken" in error.message() and words in error.message(), \
            error.message()
        after = [answers.get(timeout=30) for _ in range(3)]
        assert [int(r.as_numpy("OUT")[0]) for r, e in after[:2]] == [4, 5] and _final(after[2][0])
    finally:
        c.stop_stream()
        c.close()


def test_a_client_that_stops_reading_stops_the_model(served: tuple[DaemonProcess, Path]) -> None:
    """The flood model makes 200 responses of 256 KiB (50 MiB); a raw gRPC
    stream reads one and stops: what the model made beyond it stays within
    the daemon's queue, its read-ahead and the sockets' and gRPC's buffers,
    and everything comes once reading resumes."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    d, count = served
    total = 200
    request = pb.ModelInferRequest(model_name="flood", id="flood")
    request.inputs.add(name="IN", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([total], np.int32).tobytes())
    channel = grpc.insecure_channel(d.grpc_unix, options=[("grpc.max_receive_message_length", 1 << 24)])
    try:
        stream = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([request]))
        first = next(stream)
        assert not first.error_message and first.infer_response.id == "flood"
        assert wait_for(lambda: count.exists() and int(count.read_text() or 0) > 1, 30)
        made = []
        for _ in range(3):   # settled: the model waits at its yield
            time.sleep(0.5)
            made.append(int(count.read_text() or 0))
        assert made[-1] == made[-2] < total // 2, made
        rest = [r for r, _ in zip(stream, range(total - 1), strict=False)]
        assert len(rest) == total - 1 and all(not r.error_message for r in rest)
        assert int(count.read_text()) == total
    finally:
        channel.close()


def _post(d: DaemonProcess, path: str, doc: object) -> http.client.HTTPResponse:
    host, port = d.host_port.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", path, json.dumps(doc), {"Content-Type": "application/json"})
    return conn.getresponse()


def test_generate_stream_sends_each_response_as_an_event(served: tuple[DaemonProcess, Path]) -> None:
    d, _ = served
    answer = _post(d, "/v2/models/repeat/generate_stream", {"IN": [5, 6, 7], "id": "g1", "temperature": 0.5})
    assert answer.status == 200 and answer.getheader("Content-Type").startswith("text/event-stream")
    events = answer.read().decode().split("\n\n")
    assert events[-1] == "" and all(e.startswith("data: ") for e in events[:-1]), events
    docs = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert [(doc["OUT"], doc["IDX"], doc["id"], doc["model_name"]) for doc in docs] == \
        [(5, 0, "g1", "repeat"), (6, 1, "g1", "repeat"), (7, 2, "g1", "repeat")]
    # a model that answers once: one event, its outputs by name
    answer = _post(d, "/v2/models/echo/generate_stream", {"x_int32": [[1, 2]], "x_string": [["hi"]]})
    assert answer.status == 200, answer.read()
    (event,) = [e for e in answer.read().decode().split("\n\n") if e]
    doc = json.loads(event[len("data: "):])
    assert doc["y_int32"] == [[1, 2]] and doc["y_string"] == "hi"


def test_generate_answers_one_response(served: tuple[DaemonProcess, Path]) -> None:
    d, _ = served
    answer = _post(d, "/v2/models/repeat/generate", {"IN": 9})
    assert answer.status == 200
    got = json.loads(answer.read())
    assert set(got) == {"model_name", "model_version", "OUT", "IDX"} and (got["OUT"], got["IDX"]) == (9, 0)
    answer = _post(d, "/v2/models/echo/generate", {"x_int32": [[3, 4]], "x_string": [["a", "b"]]})
    assert answer.status == 200 and json.loads(answer.read())["y_string"] == [["a", "b"]]
    for model, doc, words in (("repeat", {"IN": [1, 2]}, "more than one response"),
                              ("repeat", {"IN": 1, "weird": {"a": 1}}, "field 'weird' is no input"),
                              ("repeat", {}, "'IN' not given"),
                              ("repeat", [1], "must be a JSON object")):
        answer = _post(d, f"/v2/models/{model}/generate", doc)
        assert answer.status == 400 and words in json.loads(answer.read())["error"], (doc, words)


def test_generate_loads_on_demand_and_a_stream_of_no_response_is_named(served: tuple[DaemonProcess, Path]) -> None:
    d, _ = served
    answer = _post(d, "/v2/models/generated/generate_stream", {"IN": [5, 6]})   # decoupled, in the store only
    assert answer.status == 200, answer.read()
    events = [json.loads(e[len("data: "):]) for e in answer.read().decode().split("\n\n") if e]
    assert [(doc["OUT"], doc["IDX"]) for doc in events] == [(5, 0), (6, 1)]
    answer = _post(d, "/v2/models/echo3/generate", {"x_int32": [[3]], "x_string": [["a"]]})   # answers once
    assert answer.status == 200 and json.loads(answer.read())["y_int32"] == 3   # one element, as generate gives it
    answer = _post(d, "/v2/models/repeat/generate_stream", {"IN": []})   # a stream of no response: no event
    assert answer.status == 200 and answer.read() == b""
    answer = _post(d, "/v2/models/repeat/generate", {"IN": []})
    assert answer.status == 502 and "sent no response" in json.loads(answer.read())["error"]


def test_a_decoupled_models_outputs_in_shared_memory_are_refused(served: tuple[DaemonProcess, Path]) -> None:
    import tritonclient.utils.shared_memory as shm

    d, _ = served
    c = tg.InferenceServerClient(d.grpc_unix)
    key = f"/cs-decoupled-{os.getpid()}"
    handle = shm.create_shared_memory_region("outs", key, 64)
    answers: queue.Queue = queue.Queue()
    try:
        c.register_system_shared_memory("outs", key, 64)
        out = tg.InferRequestedOutput("OUT")
        out.set_shared_memory("outs", 4)
        c.start_stream(callback=lambda result, error: answers.put((result, error)))
        c.async_stream_infer("repeat", _in([1]), outputs=[out])
        _, error = answers.get(timeout=30)
        assert error is not None and "not in shared memory" in error.message(), error
        c.stop_stream()
    finally:
        c.unregister_system_shared_memory("outs")
        c.close()
        shm.destroy_shared_memory_region(handle)
