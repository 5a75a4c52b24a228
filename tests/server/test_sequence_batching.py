"""Triton's sequence batcher, direct strategy, through a real daemon, real
python runners and stock tritonclient (HTTP and gRPC): a model that keeps
an accumulator per sequence, keyed by the CORRID control input the daemon
fills, and answers its process id and the controls it got. Interleaved
sequences keep their own sums, each on one instance of two; START, END,
READY and CORRID arrive as configured (START declared in carton.toml, the
others not); a sequence idle past max_sequence_idle_microseconds is ended
and a later request without START is refused naming it; a new sequence
waits for a slot, and is refused naming the holders past restart_wait; a
sequence whose runner was killed fails naming that rather than landing
where its state is not; each config and request refusal names its field."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from conftest import short_dir
from kit.daemonkit import DaemonProcess, call, wait_for
from kit.inferkit import runner_pids
from kit.runnerkit import carton_toml
from tritonclient.utils import InferenceServerException

from cartonstore.errors import InvalidInput
from cartonstore.server.models.sequence_config import sequence_policy
from cartonstore.v2.binary_form import with_inputs

ACCUMULATOR = '''
import os
import numpy as np

class Accumulator:
    def __init__(self):
        self.sums = {}

    def infer_with_tensors(self, t):
        corrid = int(t["CORRID"].reshape(-1)[0])
        if int(t["START"].reshape(-1)[0]):
            self.sums[corrid] = 0
        if corrid not in self.sums:
            raise ValueError(f"sequence {corrid} has no state here: it never started on this process")
        self.sums[corrid] += int(t["x"].reshape(-1)[0])
        flags = [int(t[k].reshape(-1)[0]) for k in ("START", "END", "READY")]
        out = {"acc": np.array([[self.sums[corrid]]], dtype=np.int32),
               "pid": np.array([[os.getpid()]], dtype=np.int64),
               "flags": np.array([flags], dtype=np.int32),
               "corrid": np.array([[corrid]], dtype=np.uint64)}
        if flags[1]:
            del self.sums[corrid]
        return out

def get_model():
    return Accumulator()
'''


def _flag(name: str, kind: str) -> dict[str, Any]:
    return {"name": name, "control": [{"kind": kind, "int32_false_true": [0, 1]}]}


CONTROLS = [_flag("START", "CONTROL_SEQUENCE_START"), _flag("END", "CONTROL_SEQUENCE_END"),
            _flag("READY", "CONTROL_SEQUENCE_READY"),
            {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]}]


def sequence_config(idle_us: int, instances: int, max_batch: int) -> dict[str, Any]:
    return {"max_batch_size": max_batch, "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
            "sequence_batching": {"max_sequence_idle_microseconds": idle_us, "direct": {},
                                  "control_input": CONTROLS}}


def _carton(dest: Path) -> Path:
    (dest / "model").mkdir(parents=True, exist_ok=True)
    (dest / "model" / "main.py").write_text(ACCUMULATOR)
    (dest / "carton.toml").write_text(carton_toml(
        "python", ">=3.8", {"entrypoint_package": "main", "entrypoint_fn": "get_model"}, model_name=dest.name,
        inputs=[("x", "int32", ["batch", 1]), ("START", "int32", ["batch", 1])],
        outputs=[("acc", "int32", ["batch", 1]), ("pid", "int64", ["batch", 1]), ("flags", "int32", ["batch", 3]),
                 ("corrid", "uint64", ["batch", 1])]))
    return dest


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[DaemonProcess, Path]]:
    with short_dir() as base:
        (base / "cartonstore.toml").write_text('[runners]\nrestart_wait = "1s"\nrestart_backoff = "0s"\n')
        d = DaemonProcess(base / "root", extra_args=["--config", str(base / "cartonstore.toml"),
                                                     "--grpc-listen", "127.0.0.1:0"],
                          log_file=base / "daemon.log").start()
        source = _carton(base / "acc")
        yield d, source
        d.stop()
        assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)


def _load(d: DaemonProcess, name: str, source: Path, config: dict[str, Any]) -> tuple[int, Any]:
    return call(d, "POST", f"/v2/repository/models/{name}/load",
                json={"parameters": {"source": str(source), "config": json.dumps(config)}})


def _loaded(d: DaemonProcess, name: str, source: Path, config: dict[str, Any]) -> None:
    status, body = _load(d, name, source, config)
    assert status == 200, body


def infer(d: DaemonProcess, module: Any, name: str, seq: int | str, x: int, *, start: bool = False,
          end: bool = False) -> dict[str, list[int]]:
    """One request of sequence ``seq``; the model's outputs as lists."""
    c = module.InferenceServerClient(d.host_port if module is th else d.grpc_host_port)
    try:
        tensor = module.InferInput("x", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[x]], dtype=np.int32))
        result = c.infer(name, [tensor], sequence_id=seq, sequence_start=start, sequence_end=end)
        return {k: result.as_numpy(k).reshape(-1).tolist() for k in ("acc", "pid", "flags", "corrid")}
    finally:
        c.close()


def test_interleaved_sequences_keep_their_state_each_on_one_instance(served: tuple[DaemonProcess, Path]) -> None:
    d, source = served
    _loaded(d, "seq", source, sequence_config(30_000_000, instances=2, max_batch=2))
    ids = {1001: th, 1002: tg, 1003: th}
    pids: dict[int, set[int]] = {seq: set() for seq in ids}
    sums = dict.fromkeys(ids, 0)
    for step in range(4):
        for seq, module in ids.items():
            x = seq % 10 + step
            out = infer(d, module, "seq", seq, x, start=step == 0, end=step == 3)
            sums[seq] += x
            assert out["acc"] == [sums[seq]], (seq, step, out)
            assert out["corrid"] == [seq]
            assert out["flags"] == [int(step == 0), int(step == 3), 1], (seq, step)
            pids[seq].add(out["pid"][0])
    assert all(len(p) == 1 for p in pids.values()), pids
    assert len(set().union(*pids.values())) == 2, "the sequences are spread over both instances"
    # the config read back says what it serves, and loads again as it is
    status, config = call(d, "GET", "/v2/models/seq/config")
    assert status == 200 and isinstance(config, dict)
    assert config["sequence_batching"]["control_input"][3] == CONTROLS[3]
    assert config["sequence_batching"]["max_sequence_idle_microseconds"] == 30_000_000
    _loaded(d, "seq", source, config)
    assert call(d, "GET", "/v2/models/seq/config") == (200, config)


def test_a_request_after_the_end_or_without_start_is_refused_naming_it(served: tuple[DaemonProcess, Path]) -> None:
    d, source = served
    _loaded(d, "seq", source, sequence_config(30_000_000, instances=2, max_batch=2))
    with pytest.raises(InferenceServerException, match=r"sequence 77 .*must specify the START flag"):
        infer(d, th, "seq", 77, 1)
    infer(d, tg, "seq", 78, 1, start=True, end=True)
    with pytest.raises(InferenceServerException, match=r"sequence 78 .*START flag.*ended: its END request came"):
        infer(d, tg, "seq", 78, 1)
    with pytest.raises(InferenceServerException, match=r"non-zero or non-empty correlation ID"):
        c = th.InferenceServerClient(d.host_port)
        try:
            tensor = th.InferInput("x", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[1]], dtype=np.int32))
            c.infer("seq", [tensor])
        finally:
            c.close()
    with pytest.raises(InferenceServerException, match=r"sequence_id 'abc' must be an unsigned integer"):
        infer(d, th, "seq", "abc", 1, start=True)
    for params, words in (({"sequence_id": 6, "sequence_start": "yes"}, "'sequence_start' must be a boolean"),
                          ({"sequence_id": 1 << 64, "sequence_start": True}, "is outside [1, 2^64)"),
                          ({"sequence_id": -3, "sequence_start": True}, "is outside [1, 2^64)")):
        status, body = call(d, "POST", "/v2/models/seq/infer", json={
            "parameters": params, "inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 1], "data": [1]}]})
        assert status == 400 and words in str(body), (params, body)
    # a control input is the daemon's to set, declared in carton.toml or not
    for control in ("START", "CORRID"):
        status, body = call(d, "POST", "/v2/models/seq/infer", json={
            "parameters": {"sequence_id": 5, "sequence_start": True},
            "inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 1], "data": [1]},
                       {"name": control, "datatype": "INT32", "shape": [1, 1], "data": [1]}]})
        assert status == 400 and control in str(body), body


def test_a_start_for_a_live_sequence_starts_it_again_on_its_instance(served: tuple[DaemonProcess, Path]) -> None:
    d, source = served
    _loaded(d, "again", source, sequence_config(30_000_000, instances=2, max_batch=1))
    first = infer(d, th, "again", 41, 1, start=True)
    assert infer(d, tg, "again", 41, 2)["acc"] == [3]
    again = infer(d, th, "again", 41, 5, start=True)
    assert again["acc"] == [5] and again["flags"] == [1, 0, 1] and again["pid"] == first["pid"]


def test_an_idle_sequence_ends_and_frees_its_slot(served: tuple[DaemonProcess, Path]) -> None:
    d, source = served
    _loaded(d, "idle", source, sequence_config(300_000, instances=1, max_batch=1))
    assert infer(d, th, "idle", 9, 4, start=True)["acc"] == [4]
    assert infer(d, th, "idle", 9, 1)["acc"] == [5]
    time.sleep(1.0)
    with pytest.raises(InferenceServerException,
                       match=r"sequence 9 .*ended: no request for max_sequence_idle_microseconds 300000"):
        infer(d, tg, "idle", 9, 1)
    # its slot is free again: a new sequence takes it at once
    assert infer(d, tg, "idle", 10, 2, start=True)["acc"] == [2]


def test_a_new_sequence_waits_for_a_slot_then_is_refused_naming_the_holder(
        served: tuple[DaemonProcess, Path]) -> None:
    d, source = served
    _loaded(d, "one", source, sequence_config(30_000_000, instances=1, max_batch=1))
    infer(d, th, "one", 21, 1, start=True)
    with pytest.raises(InferenceServerException, match=r"sequence 22 found every sequence slot held .*sequence\(s\) 21"):
        infer(d, th, "one", 22, 1, start=True)
    # a waiting START goes on once the holder ends
    got: list[Any] = []
    waiting = threading.Thread(target=lambda: got.append(infer(d, tg, "one", 23, 7, start=True)))
    waiting.start()
    time.sleep(0.3)
    infer(d, th, "one", 21, 1, end=True)
    waiting.join(10)
    assert got and got[0]["acc"] == [7] and got[0]["flags"] == [1, 0, 1]


def test_a_sequence_whose_runner_died_fails_naming_it(served: tuple[DaemonProcess, Path]) -> None:
    d, source = served
    _loaded(d, "die", source, sequence_config(30_000_000, instances=2, max_batch=1))
    pid = infer(d, th, "die", 31, 3, start=True)["pid"][0]
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: _instance_back(d, "die", pid), 30)
    with pytest.raises(InferenceServerException, match=r"sequence 31 of model 'die' lost its state: runner for die "
                                                       r"\(instance \d\) restarted"):
        infer(d, th, "die", 31, 1)
    with pytest.raises(InferenceServerException, match=r"START flag.*ended: runner for die"):
        infer(d, th, "die", 31, 1)
    assert infer(d, tg, "die", 31, 5, start=True)["acc"] == [5]   # started again, it runs


def _instance_back(d: DaemonProcess, name: str, dead: int) -> bool:
    status, rows = call(d, "POST", "/v2/repository/index", json={})
    assert status == 200, rows
    row = next(r for r in rows if r["name"] == name)  # type: ignore[union-attr]  # a list of rows
    return row["state"] == "READY" and dead not in row["pids"] and None not in row["pids"]


@pytest.mark.parametrize(("change", "named"), [
    ({"oldest": {}}, "'oldest'"),
    ({"state": [{"input_name": "a", "output_name": "b"}]}, "'state'"),
    ({"direct": {"max_queue_delay_microseconds": 10}}, "max_queue_delay_microseconds"),
    ({"control_input": [{"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_CORRID",
                                                   "data_type": "TYPE_FP32"}]}]}, "data_type"),
    ({"control_input": [{"name": "S", "control": [{"fp32_false_true": [0.0]}]}]}, "fp32_false_true"),
    ({"control_input": [_flag("A", "CONTROL_SEQUENCE_END"), _flag("B", "CONTROL_SEQUENCE_END")]},
     "two control inputs are CONTROL_SEQUENCE_END"),
])
def test_a_sequence_config_cartonstore_does_not_serve_is_refused_by_name(
        served: tuple[DaemonProcess, Path], change: dict[str, Any], named: str) -> None:
    d, source = served
    config = {"sequence_batching": change if "oldest" in change else {"direct": {}, **change}}
    status, body = _load(d, "refused", source, config)
    assert status == 400 and named in json.dumps(body), body
    status, body = call(d, "GET", "/v2/models/refused/ready")
    assert status != 200


def test_sequence_batching_with_another_scheduler_or_a_mistyped_control_is_refused() -> None:
    for other in ({"dynamic_batching": {}}, {"response_cache": {"enable": True}}):
        with pytest.raises(InvalidInput, match=next(iter(other))):
            sequence_policy({"sequence_batching": {}, **other}, None)
    from cartonstore.format.carton_toml import TensorSpec
    with pytest.raises(InvalidInput, match=r"'START' is INT32, but the carton declares it FP32"):
        sequence_policy({"sequence_batching": {"control_input": [_flag("START", "CONTROL_SEQUENCE_START")]}},
                        [TensorSpec(name="START", dtype="float32", shape=(1,))])
    policy = sequence_policy({"sequence_batching": {}}, None)
    assert policy is not None and policy.idle_us == 1_000_000 and policy.controls == ()   # Triton's default


def test_controls_join_the_header_and_leave_the_binary_data_as_they_were() -> None:
    header = json.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1],
                                     "parameters": {"binary_data_size": 4}}]}).encode()
    data = np.array([7], dtype=np.int32).tobytes()
    extra = [{"name": "START", "datatype": "INT32", "shape": [1], "data": [1]}]
    parts, length = with_inputs([header + data[:2], data[2:]], len(header), extra)
    doc = json.loads(bytes(parts[0]))
    assert len(parts[0]) == length and doc["inputs"][1] == extra[0]
    assert b"".join(bytes(p) for p in parts[1:]) == data
    parts, length = with_inputs([b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [7]}]}'],
                                None, extra)
    assert [i["name"] for i in json.loads(bytes(parts[0]))["inputs"]] == ["x", "START"]


STREAMING = '''
import numpy as np

class Repeat:
    def infer_stream_with_tensors(self, tensors):
        yield {"acc": tensors["x"]}

def get_model():
    return Repeat()
'''


def test_a_decoupled_model_with_sequence_batching_is_refused_and_nothing_stays_loaded(
        served: tuple[DaemonProcess, Path]) -> None:
    d, source = served
    streaming = _carton(source.parent / "streaming")
    (streaming / "model" / "main.py").write_text(STREAMING)
    status, body = _load(d, "streams", streaming, sequence_config(1_000_000, instances=1, max_batch=1))
    assert status == 400 and "decoupled" in str(body) and "sequence_batching" in str(body), body
    status, rows = call(d, "POST", "/v2/repository/index", json={})
    row = next(r for r in rows if r["name"] == "streams")  # type: ignore[union-attr]  # a list of rows
    assert row["state"] == "UNAVAILABLE" and not row.get("pids"), row
