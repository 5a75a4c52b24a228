"""Dynamic batching in the daemon (Triton's dynamic_batching), through real
daemons, real python runners and tritonclient: concurrent requests are
joined along their first dimension and cut back, each answer with its own
rows, id and output framing; requests of other shapes are not mixed; a
batch never passes max_batch_size; a preferred size goes at once; a
model's failure reaches every request of its batch; the queue is
bounded; statistics count executions and batch sizes as Triton does; the
config is answered back, and every bad dynamic_batching is refused naming
what is wrong."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from kit.daemonkit import DaemonProcess, call
from kit.inferkit import third_party_runner
from kit.runnerkit import carton_toml
from kit.together import all_at_once
from tritonclient.utils import InferenceServerException

MODEL = '''
import time
import numpy as np

class Model:
    def infer_with_tensors(self, tensors):
        x = tensors["x"]
        if (x < 0).any():
            raise ValueError("a negative input, on purpose")
        time.sleep(0.05)   # long enough for requests to gather
        n = x.shape[0]
        out = {"y": x * 2, "seen": np.full(n, n, dtype=np.int64)}
        if (x == 777).any():
            out["seen"] = np.array([n], dtype=np.int64)[:0]   # no row per request: cannot be cut back
        return out

def get_model():
    return Model()
'''


def _carton(dest: Path, *, declared: bool = True) -> Path:
    (dest / "model").mkdir(parents=True)
    (dest / "model" / "main.py").write_text(MODEL)
    decls = {"inputs": [("x", "float32", ["batch", "k"])],
             "outputs": [("y", "float32", ["batch", "k"]), ("seen", "int64", ["batch"])]} if declared else {}
    (dest / "carton.toml").write_text(carton_toml("python", ">=3.8", {"entrypoint_package": "main",
                                                                      "entrypoint_fn": "get_model"},
                                                  model_name=dest.name, **decls))
    return dest


def _load(d: DaemonProcess, name: str, src: Path, config: dict) -> tuple[int, dict]:
    return call(d, "POST", f"/v2/repository/models/{name}/load",
                json={"parameters": {"source": str(src), "config": json.dumps(config)}})


def _infer(port: str, name: str, x: np.ndarray, *, binary: bool = True, request_id: str = "") -> triton.InferResult:
    c = triton.InferenceServerClient(port, network_timeout=60)
    try:
        tensor = triton.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("y", "seen")]
        return c.infer(name, [tensor], outputs=outputs, request_id=request_id)
    finally:
        c.close()


def _concurrently(count: int, fn) -> list[Any]:
    return all_at_once([functools.partial(fn, i) for i in range(count)])


BATCHING = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 300_000}}


def test_concurrent_requests_are_joined_and_each_gets_its_own_rows(daemon: DaemonProcess, tmp_path: Path) -> None:
    status, body = _load(daemon, "b", _carton(tmp_path / "b"), BATCHING)
    assert status == 200, body

    def one(i: int) -> tuple[np.ndarray, triton.InferResult]:
        rows = 1 + i % 3   # 1, 2 or 3 rows: a request is never split
        x = np.full((rows, 3), i, np.float32) + np.arange(3, dtype=np.float32)
        return x, _infer(daemon.host_port, "b", x, binary=i % 2 == 0, request_id=f"r{i}")
    results = _concurrently(24, one)
    seen = []
    for i, (x, result) in enumerate(results):
        np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
        assert result.get_response()["id"] == f"r{i}"
        # JSON or binary outputs, as each asked
        kinds = {o["name"]: "binary" if "binary_data_size" in o.get("parameters", {}) else "json"
                 for o in result.get_response()["outputs"]}
        assert set(kinds.values()) == {"binary" if i % 2 == 0 else "json"}, kinds
        seen.append(int(result.as_numpy("seen")[0]))
        assert len(set(result.as_numpy("seen").tolist())) == 1
    assert max(seen) <= 8 and max(seen) > 3, seen   # joined, and never past max_batch_size
    # Triton's statistics: every row counted, fewer executions than requests, by batch size
    status, stats = call(daemon, "GET", "/v2/models/b/stats")
    entry = stats["model_stats"][0]
    assert entry["inference_count"] == sum(1 + i % 3 for i in range(24))
    assert entry["inference_stats"]["success"]["count"] == 24
    assert entry["execution_count"] < 24
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in entry["batch_stats"]}
    assert sum(sizes.values()) == entry["execution_count"] and max(sizes) > 3
    assert sum(size * count for size, count in sizes.items()) == entry["inference_count"]


def test_other_shapes_are_not_mixed_and_a_preferred_size_goes_at_once(daemon: DaemonProcess, tmp_path: Path) -> None:
    config = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": "5000000",
                                                        "preferred_batch_size": [4]}}
    assert _load(daemon, "p", _carton(tmp_path / "p"), config)[0] == 200

    def one(i: int) -> tuple[float, np.ndarray, triton.InferResult]:
        x = np.full((1, 3 if i % 2 else 5), i, np.float32)   # two shapes: two groups of four
        start = time.monotonic()
        result = _infer(daemon.host_port, "p", x)
        return time.monotonic() - start, x, result
    results = _concurrently(8, one)
    for took, x, result in results:
        np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
        assert result.as_numpy("seen").tolist() == [4]   # each group of four: a preferred size, never mixed
        assert took < 4.0   # sent at once, not after the 5 s delay


@pytest.mark.slow
def test_a_failure_reaches_its_batch_and_the_queue_is_bounded(short_tmp: Path, tmp_path: Path) -> None:
    config_file = tmp_path / "cartonstore.toml"
    config_file.write_text("[runners]\nmax_inflight = 3\n")
    d = DaemonProcess(short_tmp / "root", extra_args=["--config", str(config_file)]).start()
    try:
        config = {"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": 1_500_000}}
        assert _load(d, "f", _carton(tmp_path / "f"), config)[0] == 200

        def one(i: int) -> str:
            try:
                _infer(d.host_port, "f", np.full((1, 2), -1 if i == 0 else i, np.float32))
                return "ok"
            except InferenceServerException as e:
                return str(e)
        outcomes = _concurrently(4, one)   # three wait for the delay; the fourth finds the queue full
        busy = [o for o in outcomes if "[503]" in o and "waiting to be batched" in o]
        failed = [o for o in outcomes if "a negative input, on purpose" in o]
        assert len(busy) == 1, outcomes
        if outcomes[0] == busy[0]:   # the negative request was the one refused: the others ran
            assert outcomes.count("ok") == 3, outcomes
        else:                        # it ran in a batch of three: its failure is every one's
            assert len(failed) == 3, outcomes
    finally:
        d.stop()


def test_an_answer_that_cannot_be_cut_back_fails_naming_the_output(daemon: DaemonProcess, tmp_path: Path) -> None:
    """A carton that declares nothing (so the runner checks nothing) whose
    model returns an output without a row per request."""
    assert _load(daemon, "u", _carton(tmp_path / "u", declared=False),
                 {"max_batch_size": 4, "dynamic_batching": {"max_queue_delay_microseconds": 300_000}})[0] == 200

    def one(i: int) -> str:
        try:
            _infer(daemon.host_port, "u", np.full((1, 2), 777, np.float32))
            return "ok"
        except InferenceServerException as e:
            return str(e)
    outcomes = _concurrently(2, one)
    assert any("dynamic batching: output 'seen' of a batch of 2 has shape [0]" in o for o in outcomes), outcomes


def test_the_config_is_answered_back_and_bad_ones_are_refused(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = _carton(tmp_path / "c")
    config = {"max_batch_size": 8, "dynamic_batching": {"preferred_batch_size": [8, 2],
                                                        "max_queue_delay_microseconds": 100}}
    assert _load(daemon, "c", src, config)[0] == 200
    status, answered = call(daemon, "GET", "/v2/models/c/config")
    assert answered["dynamic_batching"] == {"preferred_batch_size": [2, 8], "max_queue_delay_microseconds": 100}
    assert _load(daemon, "c", src, answered)[0] == 200   # what it answers loads again
    for bad, words in (
        ({"dynamic_batching": {}}, "dynamic_batching joins requests along their first dimension, so it needs "
                                   "max_batch_size > 0"),
        ({"max_batch_size": 8, "dynamic_batching": {"priority_levels": 2}},
         "dynamic_batching: cartonstore does not support 'priority_levels' = 2"),
        ({"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": -1}},
         "Failed to parse max_queue_delay_microseconds field: Value out of range: -1"),   # protobuf's uint64
        ({"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": "10000001"}},
         "'max_queue_delay_microseconds' must be an integer in [0, 10000000]"),
        ({"max_batch_size": 8, "dynamic_batching": {"preferred_batch_size": [16]}},
         "'preferred_batch_size' must be a list of sizes in [1, max_batch_size 8]"),
        ({"max_batch_size": 8, "dynamic_batching": "fast"}, "'config' is not a Triton ModelConfig"),
    ):
        status, body = _load(daemon, "c", src, bad)
        assert status == 400 and words in body["error"], (bad, body)
    status, answered = call(daemon, "GET", "/v2/models/c/config")   # the version that served keeps serving
    assert answered["dynamic_batching"]["preferred_batch_size"] == [2, 8]


@pytest.mark.parametrize("rows", [1, 3])
def test_a_lone_request_goes_as_it_came(daemon: DaemonProcess, tmp_path: Path, rows: int) -> None:
    """With no other request to join, a request is sent as it is: a JSON
    answer for a JSON request, at once when the delay is 0."""
    assert _load(daemon, "l", _carton(tmp_path / f"l{rows}"), {"max_batch_size": 4, "dynamic_batching": {}})[0] == 200
    x = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    result = _infer(daemon.host_port, "l", x, binary=False)
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
    assert result.as_numpy("seen").tolist() == [rows] * rows
    assert all("binary_data_size" not in o.get("parameters", {}) for o in result.get_response()["outputs"])


def test_requests_waiting_at_an_unload_are_sent_not_dropped(daemon: DaemonProcess, tmp_path: Path) -> None:
    """An unload sends what waits in the batcher at once (its runners then
    stop), rather than letting the waiting requests find them gone."""
    src = _carton(tmp_path / "w")
    assert _load(daemon, "w", src, {"max_batch_size": 8,
                                    "dynamic_batching": {"max_queue_delay_microseconds": 5_000_000}})[0] == 200

    def one(i: int) -> object:
        if i == 2:
            time.sleep(1.0)   # the others wait in the batcher by now (nothing shows its queue; 1 s of its 5 s delay)
            return call(daemon, "POST", "/v2/repository/models/w/unload", json={})[0]
        started = time.monotonic()
        result = _infer(daemon.host_port, "w", np.full((1, 2), i, np.float32))
        return time.monotonic() - started, result.as_numpy("seen").tolist()
    first, second, unloaded = _concurrently(3, one)
    assert unloaded == 200
    for took, seen in (first, second):
        assert seen == [2] and took < 4.0   # sent together by the unload, well before the 5 s delay


def test_a_big_request_to_a_batched_model_is_answered_whole(daemon: DaemonProcess, tmp_path: Path) -> None:
    """A body big enough for the tensor arena (over 256 KiB) to a batched
    model, which sends its batches over the runner's socket (the front and
    gRPC take no arena slot for it): the answer is whole, over HTTP and gRPC."""
    import tritonclient.grpc as tg

    assert _load(daemon, "big", _carton(tmp_path / "big"), {"max_batch_size": 4, "dynamic_batching": {}})[0] == 200
    x = np.arange(2 * 100_000, dtype=np.float32).reshape(2, 100_000)
    result = _infer(daemon.host_port, "big", x)
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
    c = tg.InferenceServerClient(daemon.grpc_unix)
    tensor = tg.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(c.infer("big", [tensor]).as_numpy("y"), x * 2)
    c.close()


# A third-party runner that answers x as y and claims, in its timing header, 1000 s of model time.
BOASTER = third_party_runner(r'''
async def infer(request):
    body = await request.read()
    length = request.headers.get("Inference-Header-Content-Length")
    header = json.loads(body[:int(length)] if length else body)
    x = header["inputs"][0]
    data = list(memoryview(body[int(length):]).cast("f")) if length else x["data"]
    answer = {"model_name": "b", "outputs": [{"name": "y", "datatype": "FP32", "shape": x["shape"], "data": data}]}
    return web.json_response(answer, headers={"Cartonstore-Timing": "queue=0;input=0;infer=1000000000000;output=0"})
''')


def test_a_runner_claiming_more_time_than_passed_is_not_believed(short_tmp: Path, tmp_path: Path) -> None:
    """Neither a request's statistics nor a batch execution's take a runner's
    timing header that claims more time than the daemon waited for it."""
    script = tmp_path / "boaster.py"
    script.write_text(BOASTER)
    config_file = tmp_path / "cartonstore.toml"
    config_file.write_text(f'[runners.boaster]\ncommand = ["{{python}}", "{script}", "{{socket}}"]\n'
                           'framework_version = "1.0.0"\n')
    src = tmp_path / "b"
    src.mkdir()
    (src / "carton.toml").write_text(carton_toml("boaster", ">=1", model_name="b",
                                                 inputs=[("x", "float32", ["batch", 2])],
                                                 outputs=[("y", "float32", ["batch", 2])]))
    d = DaemonProcess(short_tmp / "root", extra_args=["--config", str(config_file)]).start()
    try:
        assert _load(d, "plain", src, {"max_batch_size": 8})[0] == 200
        assert _load(d, "joined", src, BATCHING)[0] == 200
        started = time.monotonic()
        c = triton.InferenceServerClient(d.host_port, network_timeout=60)
        for name in ("plain", "joined"):
            x = np.arange(4, dtype=np.float32).reshape(2, 2)
            tensor = triton.InferInput("x", [2, 2], "FP32")
            tensor.set_data_from_numpy(x)
            np.testing.assert_array_equal(c.infer(name, [tensor]).as_numpy("y"), x)
        c.close()
        elapsed_ns = (time.monotonic() - started) * 1e9
        for name in ("plain", "joined"):
            entry = call(d, "GET", f"/v2/models/{name}/stats")[1]["model_stats"][0]
            assert entry["inference_stats"]["compute_infer"]["ns"] < elapsed_ns, (name, entry)
            for batch in entry["batch_stats"]:
                assert batch["compute_infer"]["ns"] < elapsed_ns, (name, entry)
        assert entry["batch_stats"], entry   # the batched model's execution was counted
    finally:
        d.stop()
