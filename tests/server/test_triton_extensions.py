"""Triton's statistics, model configuration and CUDA shared-memory
extensions, and Triton's error texts, driven by stock tritonclient.http
(sync and asyncio) against a real `cartonstore serve` and a real
onnxruntime runner."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from kit.daemonkit import DaemonProcess, call
from kit.inferkit import echo_carton, onnx_carton
from tritonclient.utils import InferenceServerException

from cartonstore.cli.commands import main


def _add(daemon: DaemonProcess, src: Path, name: str, capsys) -> str:
    assert main(["add", str(src), "--name", name, "--root", str(daemon.root), "--progress", "none", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["manifest_sha256"]


def _infer(c: triton.InferenceServerClient, name: str, x: np.ndarray) -> triton.InferResult:
    tensor = triton.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    return c.infer(name, [tensor])


@pytest.fixture
def affine(daemon: DaemonProcess, tmp_path: Path, capsys) -> tuple[DaemonProcess, str]:
    return daemon, _add(daemon, onnx_carton(tmp_path / "affine"), "affine", capsys)


def test_statistics_move_as_requests_succeed_and_fail(affine: tuple[DaemonProcess, str]) -> None:
    daemon, digest = affine
    c = triton.InferenceServerClient(daemon.host_port)
    c.load_model("affine", config=json.dumps({"max_batch_size": 8}))
    zero = c.get_inference_statistics("affine")["model_stats"][0]
    assert (zero["name"], zero["version"], zero["inference_count"], zero["last_inference"]) == ("affine", digest, 0, 0)
    assert set(zero["inference_stats"]) == {"success", "fail", "queue", "compute_input", "compute_infer",
                                            "compute_output", "cache_hit", "cache_miss"}
    for _ in range(3):
        out = _infer(c, "affine", np.ones((2, 4), np.float32))
        assert (out.as_numpy("y") == 3).all()
    with pytest.raises(InferenceServerException, match="shape"):
        _infer(c, "affine", np.ones((2, 5), np.float32))    # refused by the daemon's check: a failure all the same
    with pytest.raises(InferenceServerException, match="batch-size must be <= 8 for 'affine' \\(got 9\\)"):
        _infer(c, "affine", np.ones((9, 4), np.float32))    # over max_batch_size, as Triton refuses it
    stats = c.get_inference_statistics("affine", digest)["model_stats"][0]
    s = stats["inference_stats"]
    assert s["success"]["count"] == 3 and s["fail"]["count"] == 2
    assert stats["inference_count"] == 6 and stats["execution_count"] == 3   # a batch of 2 counts 2 inferences
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert s[phase]["count"] == 3 and s[phase]["ns"] > 0, phase
    assert s["success"]["ns"] > s["compute_infer"]["ns"]
    assert stats["last_inference"] > 1_700_000_000_000   # ms since the epoch
    everything = c.get_inference_statistics()["model_stats"]
    assert [m["name"] for m in everything] == ["affine"]
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        c.get_inference_statistics("nope")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'affine' version 7 is not found"):
        c.get_inference_statistics("affine", "7")
    # the same counters, named as Triton names them, on /metrics
    status, text = call(daemon, "GET", "/metrics")
    assert status == 200 and isinstance(text, str)
    labels = f'model="affine",version="{digest}"'
    for series, value in (("nv_inference_request_success", 3), ("nv_inference_request_failure", 2),
                          ("nv_inference_count", 6), ("nv_inference_exec_count", 3)):
        assert f"# TYPE {series} counter" in text and f"{series}{{{labels}}} {value}\n" in text, series
    assert re.search(rf'nv_inference_compute_infer_duration_us{{{labels}}} \d+', text)
    assert f'cartonstore_inference_requests_total{{model="affine",outcome="success",version="{digest}"}} 3.0' in text
    c.close()


def test_model_config_reflects_the_load_and_refuses_what_it_cannot_honour(affine: tuple[DaemonProcess, str]) -> None:
    daemon, digest = affine
    c = triton.InferenceServerClient(daemon.host_port)
    c.load_model("affine")
    config = c.get_model_config("affine")
    assert (config["name"], config["platform"], config["backend"], config["max_batch_size"]) == \
        ("affine", "onnxruntime_onnx", "onnxruntime", 0)
    assert c.get_model_metadata("affine")["platform"] == config["platform"]   # one name, as Triton answers both
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]}]
    assert config["output"] == [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1, 4]}]
    assert config["instance_group"] == [{"name": "affine_0", "kind": "KIND_CPU", "count": 1, "gpus": []}]
    assert config["parameters"]["intra_op_num_threads"] == {"string_value": "1"}
    c.load_model("affine", config=json.dumps({"max_batch_size": 4, "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
                                              "parameters": {"note": {"string_value": "hi"}},
                                              "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]}))
    config = c.get_model_config("affine", digest)
    assert config["max_batch_size"] == 4 and config["input"][0]["dims"] == [4]
    assert config["instance_group"][0]["count"] == 2 and config["parameters"]["note"] == {"string_value": "hi"}
    # what the daemon answers loads again unchanged, as does protobuf JSON's form of it (int64 dims as strings)
    c.load_model("affine", config=json.dumps(config))
    assert c.get_model_config("affine") == config
    strings = {**config, "input": [{**config["input"][0], "dims": [str(d) for d in config["input"][0]["dims"]],
                                    "format": "FORMAT_NONE", "is_shape_tensor": False}]}
    c.load_model("affine", config=json.dumps(strings))
    assert c.get_model_config("affine") == config
    refused = [
        ({"ensemble_scheduling": {}}, "does not support 'ensemble_scheduling'"),
        ({"sequence_batching": {"oldest": {}}}, "sequence_batching: cartonstore does not support 'oldest'"),
        ({"dynamic_batching": {}}, "dynamic_batching joins requests along their first dimension"),
        ({"version_policy": {"all": {}}}, "'version_policy' {'all': {}} is not supported"),
        ({"instance_group": [{"count": 1, "passive": True}]},
         "instance_group[0]: cartonstore does not support 'passive'"),
        ({"input": [{"name": "x", "reshape": {"shape": [4]}}]}, "input 'x': cartonstore does not support 'reshape'"),
        ({"input": [{"name": "x", "optional": True}]}, "does not support 'optional' = True"),
        ({"runtime": "model.py"}, "'runtime' is 'model.py'"),
        ({"max_batch_size": -1}, "'max_batch_size' must be an integer"),
        ({"platform": "tensorrt_plan"}, "'platform' is 'tensorrt_plan'"),
        ({"name": "other"}, "'name' is 'other'"),
        ({"input": [{"name": "x", "data_type": "TYPE_INT32"}]}, "data_type is 'TYPE_INT32'"),
        ({"output": [{"name": "z"}]}, "output 'z' is not one the carton declares"),
        # parsed as Triton parses it, protobuf's ModelConfig: a field it does not have, in protobuf's words
        ({"max_batch": 4}, 'is not a Triton ModelConfig: Message type "inference.ModelConfig" has no field named '
                           '"max_batch" at "ModelConfig".'),
        ({"input": [{"name": "x", "data_type": "FP32"}]}, "Invalid enum value FP32 for enum type inference.DataType"),
        ({"max_batch_size": "four"}, "Failed to parse max_batch_size field"),
    ]
    for bad, words in refused:
        with pytest.raises(InferenceServerException, match=f"failed to load 'affine'.*{re.escape(words)}"):
            c.load_model("affine", config=json.dumps(bad))
    status, body = call(daemon, "POST", "/v2/repository/models/affine/load", json={"parameters": {"config": "{nope"}})
    assert status == 400 and body["error"].startswith("failed to load 'affine': parameter 'config' is not valid JSON")
    # every refusal left the version that served as it was
    assert c.get_model_config("affine")["max_batch_size"] == 4
    assert (_infer(c, "affine", np.zeros((1, 4), np.float32)).as_numpy("y") == 1).all()
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        c.get_model_config("nope")
    c.close()


def test_a_batch_dimension_is_needed_for_max_batch_size(daemon: DaemonProcess, tmp_path: Path, capsys) -> None:
    src = onnx_carton(tmp_path / "fixed")
    toml = src / "carton.toml"
    toml.write_text(toml.read_text().replace('shape = ["N", 4]', "shape = [1, 4]"))
    assert "[1, 4]" in toml.read_text()
    _add(daemon, src, "fixed", capsys)
    c = triton.InferenceServerClient(daemon.host_port)
    with pytest.raises(InferenceServerException, match="failed to load 'fixed'.*variable first \\(batch\\) dimension"):
        c.load_model("fixed", config=json.dumps({"max_batch_size": 8}))
    c.close()


def test_triton_error_texts(daemon: DaemonProcess, tmp_path: Path, capsys) -> None:
    _add(daemon, echo_carton(tmp_path / "crash", startup="raise SystemExit(3)"), "crash", capsys)
    c = triton.InferenceServerClient(daemon.host_port)
    with pytest.raises(InferenceServerException, match="^\\[400\\] failed to load 'crash': runner for crash failed"):
        c.load_model("crash")
    with pytest.raises(InferenceServerException, match="failed to load 'nope': unknown model 'nope'"):
        c.load_model("nope")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        c.infer("nope", [triton.InferInput("x", [1], "FP32")])
    with pytest.raises(InferenceServerException, match="failed to unload 'nope'"):
        c.unload_model("nope")
    c.close()


def test_cuda_shared_memory_without_a_gpu(daemon: DaemonProcess) -> None:
    c = triton.InferenceServerClient(daemon.host_port)
    assert "cuda_shared_memory" in c.get_server_metadata()["extensions"]
    c.unregister_cuda_shared_memory()          # what shared-memory clients call first
    c.unregister_cuda_shared_memory("r0")
    assert c.get_cuda_shared_memory_status() == []
    with pytest.raises(InferenceServerException, match="Unable to find cuda shared memory region: 'r0'"):
        c.get_cuda_shared_memory_status("r0")
    handle = base64.b64encode(b"\0" * 64).decode()
    with pytest.raises(InferenceServerException, match="runners have no GPU"):
        c.register_cuda_shared_memory("r0", handle, 0, 64)
    bad = [({"raw_handle": {"b64": "@@"}, "device_id": 0, "byte_size": 1}, "not valid base64"),
           ({"raw_handle": "x", "device_id": 0, "byte_size": 1}, "'raw_handle' must be"),
           ({"raw_handle": {"b64": handle}, "device_id": -1, "byte_size": 1}, "'device_id' must be"),
           ({"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 1, "key": "k"}, "unknown field")]
    for doc, words in bad:
        status, body = call(daemon, "POST", "/v2/cudasharedmemory/region/r0/register", json=doc)
        assert status == 400 and words in body["error"], body
    assert c.get_cuda_shared_memory_status() == []
    c.close()


def test_statistics_and_config_through_the_asyncio_client(affine: tuple[DaemonProcess, str]) -> None:
    daemon, digest = affine

    async def run() -> None:
        c = triton_aio.InferenceServerClient(daemon.host_port)
        try:
            await c.load_model("affine", config=json.dumps({"max_batch_size": 2}))
            assert (await c.get_model_config("affine"))["max_batch_size"] == 2
            tensor = triton_aio.InferInput("x", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            await c.infer("affine", [tensor])
            stats = (await c.get_inference_statistics("affine"))["model_stats"][0]
            assert stats["inference_stats"]["success"]["count"] == 1 and stats["version"] == digest
            await c.unregister_cuda_shared_memory()
            assert await c.get_cuda_shared_memory_status() == []
        finally:
            await c.close()
    asyncio.run(run())
