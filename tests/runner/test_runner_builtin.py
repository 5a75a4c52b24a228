"""The built-in runners (python, onnx, torchscript) as real processes on
real Unix sockets: every dtype through the python echo model, binary and
JSON, request bodies built by tritonclient, requirements.txt, load and
model failures, real onnxruntime, and torch when it is installed."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from conftest import short_dir
from kit.runnerkit import (
    ALL_CARTON_DTYPES,
    all_dtype_decls,
    assert_stopped_cleanly,
    onnx_model_dir,
    pack_dir,
    processes_with,
    python_echo_model_dir,
    runner_session,
    start_runner,
    stop_runner,
    torchscript_model_dir,
    unix_get,
    wait_gone,
    wait_ready,
)
from kit.runnerkit import (
    runner_infer as infer,
)

from cartonstore.config.runner_command import fill_argv
from cartonstore.runner.builtin_runners import BUILTIN_RUNNERS, FRAMEWORK_VERSION_PROBES
from cartonstore.runner.protocol import EXIT_LOAD_FAILED

HCL = "Inference-Header-Content-Length"
HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    """The models and the runners' sockets (hence short: see conftest.short_dir)."""
    with short_dir() as path:
        yield path


SHARED = ("echo.sock", "typed.sock", "onnx.sock")


def assert_none_left(marker: str, keep: tuple[str, ...] = ()) -> None:
    pids = [pid for pid in processes_with(marker)
            if not any(k in Path(f"/proc/{pid}/cmdline").read_text(errors="replace") for k in keep)]
    left = [pid for pid in pids if not wait_gone(pid, 5)]
    assert not left, f"runner processes left behind: {left}"


@pytest.fixture(autouse=True)
def no_runner_left(base: Path) -> Iterator[None]:
    yield
    assert_none_left(str(base), keep=SHARED)


def _serve(kind: str, model_dir: Path, sock: Path, **kw: Any) -> Iterator[Path]:
    proc = start_runner(kind, model_dir, sock, **kw)
    try:
        wait_ready(sock, proc=proc, timeout=30)
        yield sock
    finally:
        stop_runner(proc)
    assert_none_left(str(sock))


@pytest.fixture(scope="module")
def echo(base: Path) -> Iterator[Path]:
    """The python echo model, no declared tensors (magic inputs allowed)."""
    yield from _serve("python", python_echo_model_dir(base), base / "echo.sock")


@pytest.fixture(scope="module")
def typed(base: Path) -> Iterator[Path]:
    """The python echo model declaring one input per carton dtype."""
    yield from _serve("python", python_echo_model_dir(base, name="typed", declare=all_dtype_decls()),
                      base / "typed.sock")


@pytest.fixture(scope="module")
def onnx_runner(base: Path) -> Iterator[Path]:
    yield from _serve("onnx", onnx_model_dir(base), base / "onnx.sock", opts={"intra_op_num_threads": 1})


def sample(dtype: str, *, utf8_only: bool) -> np.ndarray:
    if dtype == "string":
        words = ["héllo", "", "wörld", "x" * 300]
        values: list[Any] = [w.encode() for w in words]
        if not utf8_only:
            values[1] = b"\xff\x00raw"
        out = np.empty(4, dtype=object)
        out[:] = values
        return out.reshape(2, 2)
    info = np.iinfo(dtype) if dtype[0] in "iu" else None
    if info is not None:
        return np.array([[info.min, info.max], [0, 1]], dtype=dtype)
    return np.array([[1.5, -2.25], [np.pi, 1e30 if dtype == "float32" else 1e300]], dtype=dtype)


# -- python runner ----------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_python_echoes_every_carton_dtype(typed: Path, binary: bool) -> None:
    inputs = {f"t_{dtype}": sample(dtype, utf8_only=not binary) for dtype in ALL_CARTON_DTYPES}
    status, (doc, out) = infer(typed, inputs, binary=binary, binary_outputs=binary)
    assert status == 200
    assert {o["name"] for o in doc["outputs"]} == set(inputs)
    assert all(("data" in o) != binary for o in doc["outputs"])
    for name, array in inputs.items():
        assert out[name].dtype == array.dtype and out[name].shape == array.shape, name
        assert out[name].tolist() == array.tolist(), name
    meta = unix_get(typed, "/v2/models/m")[1]
    assert [i["datatype"] for i in meta["inputs"]] == ["FP32", "FP64", "BYTES", "INT8", "INT16", "INT32",
                                                         "INT64", "UINT8", "UINT16", "UINT32", "UINT64"]


def test_python_echoes_v2_only_dtypes(echo: Path) -> None:
    import ml_dtypes

    inputs = {"b": np.array([True, False, True]), "h": np.array([1.5, -0.25], np.float16),
              "bf": np.array([1.0, 2.5], ml_dtypes.bfloat16), "scalar": np.array(7, np.int32)}
    status, (_doc, out) = infer(echo, inputs)
    assert status == 200
    for name, array in inputs.items():
        assert out[name].dtype == array.dtype and out[name].tolist() == array.tolist(), name


def test_python_requested_outputs_only(echo: Path) -> None:
    status, (doc, out) = infer(echo, {"a": np.ones(2), "b": np.zeros(3)}, outputs=["b"], binary_outputs=False)
    assert status == 200 and list(out) == ["b"] and doc["outputs"][0]["data"] == [0, 0, 0]


def _triton_inputs(binary: bool) -> tuple[list[triton.InferInput], dict[str, np.ndarray]]:
    words = np.array([b"alpha", b"beta", b"gamma"], dtype=object)
    arrays = {"f": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.array([-1, 2**40], np.int64),
              "flag": np.array([True, False]), "words": words}
    inputs = []
    for name, array in arrays.items():
        datatype = {"f": "FP32", "i": "INT64", "flag": "BOOL", "words": "BYTES"}[name]
        tensor = triton.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    return inputs, arrays


async def _post_tritonclient_body(sock: Path, body: bytes, json_size: int | None) -> Any:
    """POST a body tritonclient built to the runner; tritonclient parses the answer."""
    headers = {HCL: str(json_size)} if json_size is not None else {}
    async with runner_session(sock) as session, session.post("http://runner/v2/models/m/infer", data=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.read()
        length = resp.headers.get(HCL)
    return triton.InferenceServerClient.parse_response_body(raw, header_length=int(length) if length else None)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_request_bodies(echo: Path, onnx_runner: Path, binary: bool) -> None:
    async def go() -> None:
        inputs, arrays = _triton_inputs(binary)
        outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in arrays]
        body, json_size = triton.InferenceServerClient.generate_request_body(
            inputs, outputs=outputs, request_id="tc-1")
        result = await _post_tritonclient_body(echo, body, json_size)
        assert result.get_response()["id"] == "tc-1"
        for name, array in arrays.items():
            if name == "words" and not binary:  # tritonclient gives JSON BYTES back as str
                array = np.array([w.decode() for w in array], dtype=object)
            np.testing.assert_array_equal(result.as_numpy(name), array)

        x = triton.InferInput("x", [2, 4], "FP32")
        x.set_data_from_numpy(np.ones((2, 4), np.float32), binary_data=binary)
        ids = triton.InferInput("ids", [2], "INT64")
        ids.set_data_from_numpy(np.array([5, 6], np.int64), binary_data=binary)
        body, json_size = triton.InferenceServerClient.generate_request_body(
            [x, ids], outputs=[triton.InferRequestedOutput("y", binary_data=binary)])
        result = await _post_tritonclient_body(onnx_runner, body, json_size)
        np.testing.assert_array_equal(result.as_numpy("y"), np.full((2, 4), 3, np.float32))
        assert result.as_numpy("ids_out") is None

    asyncio.run(asyncio.wait_for(go(), 30))


@pytest.mark.parametrize("magic, status, error", [
    ("__raise__", 500, "ValueError: the model was asked to raise"),
    ("__garbage__", 500, "the model returned list, not a dict of output name to tensor"),
])
def test_python_model_errors_are_500_and_it_keeps_serving(echo: Path, magic: str, status: int, error: str) -> None:
    assert infer(echo, {"x": np.ones(1), magic: np.ones(1)}) == (status, {"error": error})
    ok, (_, out) = infer(echo, {"x": np.ones(1)})
    assert ok == 200 and out["x"].tolist() == [1]


def test_python_model_that_crashes_takes_its_runner_down(base: Path) -> None:
    sock = base / "crash.sock"
    proc = start_runner("python", python_echo_model_dir(base, name="crashy", on_infer="crash"), sock)
    wait_ready(sock, proc=proc)
    with pytest.raises(Exception):  # noqa: B017 - the runner dies mid-request: whatever the call raises
        infer(sock, {"x": np.ones(1)})
    rc, err = stop_runner(proc, sig=0)
    assert rc == 17 and "crashing on request" in err


def test_unmet_requirements_fail_the_load_with_the_list(base: Path) -> None:
    requirements = "numpy>=1.0\nsurely-not-installed-pkg>=2\nnumpy<1\n"
    model = python_echo_model_dir(base, name="needy", requirements=requirements)
    rc, err = stop_runner(start_runner("python", model, base / "needy.sock"), sig=0, timeout=20)
    assert rc == EXIT_LOAD_FAILED
    last = err.strip().splitlines()[-1]
    assert "model/requirements.txt is not met" in last
    assert "surely-not-installed-pkg>=2 (not installed)" in last
    assert f"numpy<1 (installed: {np.__version__})" in last


@pytest.mark.parametrize("variant, expected_rc, reason", [
    ({"on_load": "raise"}, EXIT_LOAD_FAILED, "echo_model.get_model() raised RuntimeError: the model refuses to load"),
    ({"on_load": "exit"}, 5, "echo model: exiting at start"),
    ({"opts": {"entrypoint_fn": "nope"}}, EXIT_LOAD_FAILED, "has no function 'nope'"),
    ({"opts": {"entrypoint_package": "missing_pkg"}}, EXIT_LOAD_FAILED,
     "cannot import entrypoint_package 'missing_pkg': ModuleNotFoundError"),
    ({"opts": {"entrypoint_fn": 3}}, EXIT_LOAD_FAILED, "runner option entrypoint_fn is 3"),
])
def test_python_load_failures(base: Path, variant: dict, expected_rc: int, reason: str) -> None:
    label = f"bad{abs(hash(json.dumps(variant, sort_keys=True))) % 10**6}"
    model = python_echo_model_dir(base, name=label, **variant)
    rc, err = stop_runner(start_runner("python", model, base / f"{label}.sock"), sig=0, timeout=20)
    assert rc == expected_rc
    assert reason in err.strip().splitlines()[-1]


def test_python_model_that_never_gets_ready(base: Path) -> None:
    sock = base / "slow.sock"
    proc = start_runner("python", python_echo_model_dir(base, name="slow", on_load="never_ready"), sock)
    with pytest.raises(TimeoutError):
        wait_ready(sock, timeout=2.0, proc=proc)
    stop_runner(proc)
    assert proc.returncode is not None


# -- onnx runner ------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_onnx_infer(onnx_runner: Path, binary: bool) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    ids = np.array([7, -8, 2**50], np.int64)
    status, (_doc, out) = infer(onnx_runner, {"x": x, "ids": ids}, binary=binary, binary_outputs=binary)
    assert status == 200
    np.testing.assert_array_equal(out["y"], x * 2 + 1)
    np.testing.assert_array_equal(out["ids_out"], ids)
    assert unix_get(onnx_runner, "/v2/models/m")[1]["platform"] == "onnxruntime_onnx"


def test_onnx_runtime_error_is_500_and_it_keeps_serving(onnx_runner: Path) -> None:
    status, error = infer(onnx_runner, {"x": np.ones((1, 4), np.float64), "ids": np.ones(1, np.int64)})
    assert status == 500 and "error" in error
    status, (_, out) = infer(onnx_runner, {"x": np.ones((1, 4), np.float32), "ids": np.ones(1, np.int64)})
    assert status == 200 and out["y"].tolist() == [[3, 3, 3, 3]]


def test_onnx_model_file_option_and_missing_file(base: Path) -> None:
    model = onnx_model_dir(base, name="renamed", model_file="nets/affine.onnx")
    sock = base / "renamed.sock"
    proc = start_runner("onnx", model, sock)
    try:
        wait_ready(sock, proc=proc, timeout=30)
        status, (_, out) = infer(sock, {"x": np.zeros((1, 4), np.float32), "ids": np.zeros(1, np.int64)})
        assert status == 200 and out["y"].tolist() == [[1, 1, 1, 1]]
    finally:
        assert_stopped_cleanly(proc)
    for opts, reason in [({"model_file": "absent.onnx"}, "model file model/absent.onnx does not exist"),
                         ({"model_file": "../carton.toml"}, "points outside the carton's model/ directory"),
                         ({"intra_op_num_threads": "two"}, "'intra_op_num_threads' must be an integer"),
                         ({"prepacking": "sometimes"}, "'prepacking' must be true or false")]:
        rc, err = stop_runner(start_runner("onnx", model, sock, opts=opts), sig=0, timeout=30)
        assert rc == EXIT_LOAD_FAILED and reason in err.strip().splitlines()[-1]


@pytest.mark.parametrize("prepacking", [True, False, "false"])
def test_onnx_prepacking_option_reaches_the_session(base: Path, prepacking: bool | str) -> None:
    """[runner.opts] prepacking = false (Triton's string parameters too)
    disables onnxruntime's weight prepacking; the model answers the same."""
    from cartonstore.runner.args import parse_runner_args
    from cartonstore.runner.backends import onnx as onnx_runner

    model = onnx_model_dir(base, name=f"pre-{prepacking}")
    ctx = parse_runner_args(["--model-dir", str(model), "--socket", str(base / "unused.sock"), "--name", "m",
                             "--version", "1", "--opts", json.dumps({"prepacking": prepacking}), "--devices", "cpu"])
    loaded = onnx_runner.load(ctx)
    options = loaded._session.get_session_options()
    if prepacking is True:   # onnxruntime's default: the entry is not set at all
        with pytest.raises(RuntimeError, match="does not have configuration"):
            options.get_session_config_entry("session.disable_prepacking")
    else:
        assert options.get_session_config_entry("session.disable_prepacking") == "1"
    out = loaded.infer({"x": np.ones((2, 4), np.float32), "ids": np.arange(2, dtype=np.int64)}, {})
    assert out["y"].tolist() == [[3.0] * 4] * 2


# -- torchscript runner -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed in this environment")
def test_torchscript_infer(base: Path) -> None:
    sock = base / "torch.sock"
    proc = start_runner("torchscript", torchscript_model_dir(base), sock, opts={"num_threads": 1})
    try:
        wait_ready(sock, proc=proc, timeout=60)
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        for binary in (True, False):
            status, (_, out) = infer(sock, {"x": x, "ids": np.array([3, 4])}, binary=binary, binary_outputs=binary)
            assert status == 200
            np.testing.assert_array_equal(out["y"], x * 2 + 1)
            assert out["ids_out"].tolist() == [3, 4]
        status, error = infer(sock, {"x": x})
        assert status == 500 and "error" in error
    finally:
        assert_stopped_cleanly(proc)


def test_torchscript_without_torch_fails_the_load(base: Path) -> None:
    if HAVE_TORCH:
        pytest.skip("torch is installed here")
    model = base / "nopt"
    (model / "model").mkdir(parents=True)
    (model / "model" / "model.pt").write_bytes(b"not really")
    rc, err = stop_runner(start_runner("torchscript", model, base / "nopt.sock"), sig=0, timeout=20)
    assert rc == EXIT_LOAD_FAILED and "torch is not installed" in err


# -- the daemon's view ------------------------------------------------------


def test_builtin_commands_and_framework_versions() -> None:
    import onnxruntime

    assert set(BUILTIN_RUNNERS) == {"python", "onnx", "torchscript"}
    argv = fill_argv(BUILTIN_RUNNERS["onnx"], model_dir="/m", socket="/s.sock", name="n", version="v",
                     opts="{}", devices="cpu", python="/py")
    assert argv[1:3] == ["-m", "cartonstore.runner.backends.onnx"] and "/s.sock" in argv
    assert FRAMEWORK_VERSION_PROBES["python"]() == platform.python_version()
    assert FRAMEWORK_VERSION_PROBES["onnx"]() == onnxruntime.__version__
    if HAVE_TORCH:
        assert FRAMEWORK_VERSION_PROBES["torchscript"]()
    else:
        with pytest.raises(Exception, match="torch"):
            FRAMEWORK_VERSION_PROBES["torchscript"]()


def test_test_cartons_pack(base: Path) -> None:
    for model in (python_echo_model_dir(base, name="packed-echo", declare=all_dtype_decls()),
                  onnx_model_dir(base, name="packed-onnx")):
        out = pack_dir(model, base / f"{model.name}.carton")
        assert out.stat().st_size > 0
