"""The runner SDK (cartonstore.runner): a user-written runner of a few lines,
run as a real process on a real Unix socket. Health, metadata, stats, the
binary tensor data extension both ways, malformed requests, model errors,
load failures (exit 3), SIGTERM draining, PR_SET_PDEATHSIG. Every test
checks that no runner process is left."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kit.daemonkit import wait_for
from kit.doublerkit import HCL, assert_none_left, doubler_root, infer, post, start
from kit.runnerkit import (
    assert_stopped_cleanly,
    start_runner,
    stop_runner,
    unix_get,
    unix_request,
    wait_ready,
)

from cartonstore.runner.args import parse_runner_args
from cartonstore.runner.backends.requirements import unmet_requirements
from cartonstore.runner.context import cuda_ordinal
from cartonstore.v2.framing import encode_infer_request, parse_infer_response

doubler_dir = pytest.fixture(scope="module", name="doubler_dir")(doubler_root)


@pytest.fixture(autouse=True)
def no_runner_left(doubler_dir: Path) -> Iterator[None]:
    yield
    # The module's shared runner lives on until the module ends.
    assert_none_left(str(doubler_dir), but="shared.sock")


@pytest.fixture(scope="module")
def runner(doubler_dir: Path) -> Iterator[Path]:
    proc, sock = start(doubler_dir, "shared", name="dbl", version="7")
    try:
        wait_ready(sock, proc=proc)
        yield sock
    finally:
        stop_runner(proc)
    assert_none_left(str(doubler_dir))


def stats(sock: Path) -> dict[str, Any]:
    return unix_get(sock, "/v2/models/dbl/stats")[1]["model_stats"][0]


# -- serving --------------------------------------------------------------------


def test_health_metadata_and_socket_mode(runner: Path) -> None:
    assert unix_get(runner, "/v2/health/live") == (200, {"live": True})
    assert unix_get(runner, "/v2/health/ready") == (200, {"ready": True})
    assert unix_get(runner, "/v2/models/dbl/versions/7/ready")[0] == 200
    status, meta = unix_get(runner, "/v2/models/dbl")
    assert status == 200
    assert meta == {"name": "dbl", "versions": ["7"], "platform": "carton_doubler",
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
                    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]},
                                {"name": "n", "datatype": "INT64", "shape": []}]}
    assert unix_get(runner, "/v2/models/dbl/versions/7")[1] == meta
    assert stat.S_IMODE(os.stat(runner).st_mode) == 0o600


def test_binary_infer_echoes_id_and_answers_binary(runner: Path) -> None:
    x = np.arange(5, dtype=np.float32)
    doc, out = infer(runner, {"x": x}, request_id="req-1")
    assert doc["id"] == "req-1" and doc["model_name"] == "dbl" and doc["model_version"] == "7"
    assert all("binary_data_size" in o["parameters"] for o in doc["outputs"])
    np.testing.assert_array_equal(out["y"], x * 2)
    assert out["n"].shape == () and int(out["n"]) == 5


def test_json_in_json_out_and_only_requested_outputs(runner: Path) -> None:
    doc, _out = infer(runner, {"x": np.array([1.5, 2.5], np.float32)}, binary=False, binary_outputs=False,
                     outputs=["y"], path="/v2/models/dbl/versions/7/infer")
    assert [o["name"] for o in doc["outputs"]] == ["y"]
    assert doc["outputs"][0]["data"] == [3.0, 5.0]


def test_per_output_binary_data_overrides_binary_data_output(runner: Path) -> None:
    request = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}],
               "outputs": [{"name": "y", "parameters": {"binary_data": False}}, {"name": "n"}],
               "parameters": {"binary_data_output": True}}
    status, headers, body = post(runner, json.dumps(request).encode())
    assert status == 200
    doc, out = parse_infer_response(body, int(headers[HCL]))
    assert doc["outputs"][0]["data"] == [2.0, 4.0]
    assert doc["outputs"][1]["parameters"] == {"binary_data_size": 8}
    assert int(out["n"]) == 2


def test_raw_binary_request(runner: Path) -> None:
    x = np.array([1, 2, 3], dtype="<f4")
    status, headers, body = post(runner, x.tobytes(), {HCL: "0"})
    assert status == 200, body
    _, out = parse_infer_response(body, int(headers[HCL]))
    np.testing.assert_array_equal(out["y"], x * 2)


def test_response_parameters_pass_through(runner: Path) -> None:
    doc, _ = infer(runner, {"x": np.ones(1, np.float32)}, parameters={"with_parameters": True})
    assert doc["parameters"] == {"seen": ["binary_data_output", "with_parameters"]}


def test_large_tensor_round_trip(runner: Path) -> None:
    x = np.random.default_rng(1).random(8 * 1024 * 1024, dtype=np.float32)  # 32 MiB
    _, out = infer(runner, {"x": x}, outputs=["y"])
    np.testing.assert_array_equal(out["y"], x * 2)


MALFORMED = [
    ("not json", b"{nope", {}),
    ("not an object", b"[1, 2]", {}),
    ("header past body", b"{}", {HCL: "99"}),
    ("header not a number", b"{}", {HCL: "ten"}),
    ("sizes do not add up", b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2],'
                            b'"parameters":{"binary_data_size":8}}]}1234', {}),
    ("unknown datatype", b'{"inputs":[{"name":"x","datatype":"FP31","shape":[1],"data":[1]}]}', {}),
    ("data does not fill the shape", b'{"inputs":[{"name":"x","datatype":"FP32","shape":[3],"data":[1]}]}', {}),
    ("undeclared output", b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],'
                          b'"outputs":[{"name":"zz"}]}', {}),
    ("raw binary of the wrong size", b"12345", {HCL: "0"}),
]


def test_malformed_requests_get_400_and_the_runner_keeps_serving(runner: Path) -> None:
    before = stats(runner)["inference_stats"]["fail"]["count"]
    for label, body, headers in MALFORMED:
        if label == "sizes do not add up":
            headers = {HCL: str(body.index(b"}]}") + 3)}
        status, _, answer = post(runner, body, headers)
        assert status == 400, (label, answer)
        assert "error" in json.loads(answer), label
    assert stats(runner)["inference_stats"]["fail"]["count"] == before + len(MALFORMED)
    _, out = infer(runner, {"x": np.ones(2, np.float32)})
    assert out["y"].tolist() == [2, 2]


def test_wrong_model_name_version_or_path_is_404_json(runner: Path) -> None:
    for method, path in [("POST", "/v2/models/other/infer"), ("POST", "/v2/models/dbl/versions/8/infer"),
                         ("GET", "/v2/models/other"), ("GET", "/v2/nothing")]:
        status, _, body = unix_request(runner, method, path, b"{}" if method == "POST" else None)
        assert status == 404 and "error" in json.loads(body), path


def test_a_route_asked_with_the_wrong_method_is_405_naming_the_one_it_takes(runner: Path) -> None:
    for method, path, allowed in [("GET", "/v2/models/dbl/infer", "POST"), ("POST", "/v2/health/ready", "GET"),
                                  ("DELETE", "/v2/models/dbl", "GET"),
                                  ("GET", "/v2/systemsharedmemory/region/r/register", "POST")]:
        status, headers, body = unix_request(runner, method, path, b"{}" if method == "POST" else None)
        assert (status, headers.get("Allow")) == (405, allowed), path
        assert json.loads(body) == {"error": f"{path} takes {allowed}, not {method}"}


def test_a_percent_encoded_model_name_is_the_model_s(runner: Path) -> None:
    assert unix_get(runner, "/v2/models/%64bl/versions/%37/ready")[0] == 200


def test_model_exception_is_500_and_the_runner_keeps_serving(runner: Path) -> None:
    parts, header_length = encode_infer_request({"x": np.ones(1, np.float32)}, parameters={"raise": True})
    status, _, body = post(runner, b"".join(parts), {HCL: str(header_length)})
    assert status == 500
    assert json.loads(body) == {"error": "KeyError: 'asked to raise'"}
    _, out = infer(runner, {"x": np.ones(1, np.float32)})
    assert out["y"].tolist() == [2]


def test_health_answers_while_the_model_computes(runner: Path, tmp_path: Path) -> None:
    computing = tmp_path / "computing"
    slow = threading.Thread(target=infer, args=(runner, {"x": np.ones(1, np.float32)}),
                            kwargs={"parameters": {"sleep": 1.0, "started": str(computing)}})
    slow.start()
    assert wait_for(computing.exists)
    started = time.monotonic()
    assert unix_get(runner, "/v2/health/ready")[0] == 200
    assert unix_get(runner, "/v2/models/dbl/stats")[0] == 200
    assert time.monotonic() - started < 0.5
    slow.join(10)


def test_max_concurrency_lets_infers_overlap(doubler_dir: Path) -> None:
    def elapsed_for_two(sock: Path) -> float:
        threads = [threading.Thread(target=infer, args=(sock, {"x": np.ones(1, np.float32)}),
                                    kwargs={"parameters": {"sleep": 0.6}}) for _ in range(2)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        return time.monotonic() - started

    one, sock_one = start(doubler_dir, "one", name="dbl")
    two, sock_two = start(doubler_dir, "two", {"max_concurrency": 2}, name="dbl")
    try:
        wait_ready(sock_one, proc=one)
        wait_ready(sock_two, proc=two)
        assert elapsed_for_two(sock_one) >= 1.2
        assert elapsed_for_two(sock_two) < 1.1
    finally:
        stop_runner(one)
        stop_runner(two)


# -- pure parts -----------------------------------------------------------------


def test_argv_opts_layer_over_carton_opts(doubler_dir: Path) -> None:
    ctx = parse_runner_args(["--model-dir", str(doubler_dir / "carton"), "--socket", "/tmp/s", "--name", "n",
                             "--version", "1", "--opts", '{"extra": "yes"}', "--devices", "cpu,cuda:1"])
    assert ctx.opts == {"answer": 42, "extra": "yes"}
    assert ctx.devices == ["cpu", "cuda:1"] and ctx.cuda_device() == "cuda:1"
    assert [s.name for s in ctx.inputs] == ["x"] and ctx.runner_name == "doubler"


def test_cuda_ordinal_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cuda_ordinal("cuda:3") == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert cuda_ordinal("cuda:3") == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert cuda_ordinal("cuda:3") == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5a1b")
    assert cuda_ordinal("cuda:2") == 0


@pytest.mark.parametrize("use_packaging", [True, False])
def test_requirements_check(use_packaging: bool) -> None:
    numpy_version = np.__version__
    major = int(numpy_version.split(".")[0])
    text = f"""
        # a comment
        numpy>={major}.0  # inline comment
        numpy=={numpy_version}
        numpy<{major}
        aiohttp[speedups] >=3.0, <999
        surely-not-installed-pkg==1.0
        -r other.txt
        --index-url https://example.invalid/simple
        https://example.invalid/pkg.whl
        somepkg @ https://example.invalid/somepkg.whl
        numpy>=1 ; python_version < "3"
    """
    unmet = unmet_requirements(text, use_packaging=use_packaging)
    assert [u.line for u in unmet] == [f"numpy<{major}", "surely-not-installed-pkg==1.0"]
    assert unmet[0].describe() == f"numpy<{major} (installed: {numpy_version})"
    assert unmet[1].describe() == "surely-not-installed-pkg==1.0 (not installed)"
    with pytest.raises(ValueError, match="not"):
        unmet_requirements("numpy >= = 1", use_packaging=use_packaging)


def test_the_documented_example_runs(doubler_dir: Path) -> None:
    import textwrap

    import cartonstore.runner

    doc = cartonstore.runner.__doc__
    example = textwrap.dedent(doc.split("A whole runner::", 1)[1].split("``inputs``", 1)[0])
    script = doubler_dir / "example.py"
    script.write_text(example)
    sock = doubler_dir / "example.sock"
    proc = start_runner(str(script), doubler_dir, sock, name="ex")
    try:
        wait_ready(sock, proc=proc)
        _, out = infer(sock, {"x": np.array([1, 2], np.int32)}, path="/v2/models/ex/infer")
        assert out["y"].tolist() == [2, 4]
    finally:
        assert_stopped_cleanly(proc)


def test_integer_options_from_triton_load_parameters_arrive_as_strings() -> None:
    """Triton's load-time parameters are string_value: "4" sets an integer option."""
    import pytest

    from cartonstore.runner.context import LoadError, RunnerContext

    ctx = RunnerContext(Path("/m"), Path("/s"), {"max_concurrency": "4", "bad": "4x", "low": "0"}, ["cpu"], "m", "1")
    assert ctx.opt_int("max_concurrency", 1, minimum=1) == 4
    for key in ("bad", "low"):
        with pytest.raises(LoadError, match=f"runner option '{key}' must be an integer >= 1"):
            ctx.opt_int(key, 1, minimum=1)


def test_boolean_options_take_true_false_and_their_strings() -> None:
    import pytest

    from cartonstore.runner.context import LoadError, RunnerContext

    ctx = RunnerContext(Path("/m"), Path("/s"), {"a": False, "b": " TRUE ", "c": "false", "d": "yes", "e": 1},
                        ["cpu"], "m", "1")
    assert (ctx.opt_bool("a", True), ctx.opt_bool("b", False), ctx.opt_bool("c", True)) == (False, True, False)
    assert ctx.opt_bool("absent", True) is True
    for key in ("d", "e"):
        with pytest.raises(LoadError, match=f"runner option '{key}' must be true or false"):
            ctx.opt_bool(key, True)


def test_a_runner_never_imports_aiohttp() -> None:
    """A runner's server is the standard library's sockets and threads
    (http_server.py): aiohttp, about 0.2 s to import, is not loaded at all."""
    import sys

    code = ("import sys, cartonstore.runner.backends.onnx, cartonstore.runner.backends.python, cartonstore.runner.backends.torchscript, "
            "cartonstore.runner.serving, cartonstore.runner.rest; print('aiohttp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
