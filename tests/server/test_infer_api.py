"""Inference through the daemon: a real `cartonstore serve`, real runner
processes (the built-in python and onnx runners), stock tritonclient (sync
and aio) on TCP, aiohttp on the Unix socket."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from conftest import short_dir
from kit.daemonkit import DaemonProcess, unix_session, wait_for
from kit.inferkit import DTYPES, NUMERIC, echo_carton, onnx_carton, runner_pids, runner_sockets, sample
from tritonclient.utils import InferenceServerException

V2 = {"float32": "FP32", "float64": "FP64", "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
      "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64", "string": "BYTES"}


@pytest.fixture(scope="module")
def served() -> Iterator[DaemonProcess]:
    """One daemon with the echo (python) and affine (onnx) models loaded."""
    with short_dir() as base:
        config = base / "cartonstore.toml"
        config.write_text('[server]\nmax_request_size = "64MiB"\n')  # a bomb test that stops soon
        d = DaemonProcess(base / "root", extra_args=["--config", str(config)]).start()
        _load(d, "echo", echo_carton(base / "echo"))
        _load(d, "affine", onnx_carton(base / "affine"))
        yield d
        d.stop()
        assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)


def _load(d: DaemonProcess, name: str, source: Path, **params: str) -> None:
    async def go() -> None:
        async with unix_session(d.socket_path) as s:
            r = await s.post(f"/v2/repository/models/{name}/load",
                             json={"parameters": {"source": str(source), **params}})
            assert r.status == 200, await r.text()
    asyncio.run(go())


def inputs_for(dtypes: list[str], binary: bool) -> list[triton.InferInput]:
    out = []
    for dt in dtypes:
        i = triton.InferInput(f"x_{dt}", [2, 3], V2[dt])
        i.set_data_from_numpy(sample(dt), binary_data=binary)
        out.append(i)
    return out


@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
def test_tritonclient_sync_every_dtype(served: DaemonProcess, binary_in: bool, binary_out: bool) -> None:
    c = triton.InferenceServerClient(served.host_port)
    try:
        outputs = [triton.InferRequestedOutput(f"y_{dt}", binary_data=binary_out) for dt in DTYPES]
        result = c.infer("echo", inputs_for(DTYPES, binary_in), outputs=outputs, request_id="req-7")
        assert result.get_response()["id"] == "req-7"
        for dt in NUMERIC:
            got = result.as_numpy(f"y_{dt}")
            assert got.dtype == np.dtype(dt) and np.array_equal(got, sample(dt)), dt
        strings = result.as_numpy("y_string")
        assert [v if isinstance(v, bytes) else v.encode() for v in strings.reshape(-1)] == list(
            sample("string").reshape(-1))
    finally:
        c.close()


def test_tritonclient_aio_and_selected_outputs(served: DaemonProcess) -> None:
    async def go() -> None:
        c = triton_aio.InferenceServerClient(served.host_port)
        try:
            result = await c.infer("echo", inputs_for(DTYPES, True),
                                   outputs=[triton.InferRequestedOutput("y_int64")])
            assert [o["name"] for o in result.get_response()["outputs"]] == ["y_int64"]
            assert np.array_equal(result.as_numpy("y_int64"), sample("int64"))
        finally:
            await c.close()
    asyncio.run(go())


def test_onnx_model_through_tritonclient(served: DaemonProcess) -> None:
    c = triton.InferenceServerClient(served.host_port)
    try:
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        i = triton.InferInput("x", [3, 4], "FP32")
        i.set_data_from_numpy(x)
        result = c.infer("affine", [i])
        assert np.allclose(result.as_numpy("y"), x * 2 + 1)
        md = c.get_model_metadata("affine")
        assert md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
        assert "binary_tensor_data" in c.get_server_metadata()["extensions"]
    finally:
        c.close()


def raw_post(d: DaemonProcess, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict, bytes]:
    async def go() -> tuple[int, dict, bytes]:
        async with unix_session(d.socket_path) as s:
            r = await s.post(path, data=body, headers=headers)
            return r.status, dict(r.headers), await r.read()
    return asyncio.run(go())


def test_raw_binary_request_on_the_unix_socket(served: DaemonProcess) -> None:
    x = np.arange(8, dtype=np.float32)
    status, headers, body = raw_post(served, "/v2/models/affine/infer", x.tobytes(),
                                     {"Inference-Header-Content-Length": "0"})
    assert status == 200, body
    length = int(headers["Inference-Header-Content-Length"])
    header = json.loads(body[:length])
    assert header["outputs"][0]["shape"] == [2, 4]
    assert np.allclose(np.frombuffer(body[length:], np.float32), x * 2 + 1)


def test_gzip_request_and_compressed_response(served: DaemonProcess) -> None:
    x = np.zeros((64, 4), np.float32)
    doc = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [64, 4],
                                  "data": x.reshape(-1).tolist()}]}).encode()

    async def go() -> None:
        async with unix_session(served.socket_path) as s:
            r = await s.post("/v2/models/affine/infer", data=gzip.compress(doc),
                             headers={"Content-Encoding": "gzip", "Accept-Encoding": "gzip"})
            assert r.status == 200, await r.text()
            assert r.headers["Content-Encoding"] == "gzip"
            out = await r.json()
            assert out["outputs"][0]["data"] == [1.0] * 256
            r = await s.post("/v2/models/affine/infer", data=zlib.compress(doc),
                             headers={"Content-Encoding": "deflate"})
            assert r.status == 200
    asyncio.run(go())


def runner_count(d: DaemonProcess, name: str) -> int:
    """Requests the runner itself has seen (its statistics route)."""
    sock = next(p for p in runner_sockets(d.root) if p.name.startswith(name + ".g"))

    async def go() -> int:
        async with unix_session(sock) as s:
            r = await s.get(f"/v2/models/{name}/stats")
            stats = (await r.json())["model_stats"][0]
            return stats["inference_stats"]["success"]["count"] + stats["inference_stats"]["fail"]["count"]
    return asyncio.run(go())


def _header(inputs: list, **extra: object) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


X4 = {"name": "x", "datatype": "FP32", "shape": [1, 4]}
BAD_REQUESTS = [
    ("not json", b"{nope", {}, "JSON is not valid"),
    ("unknown input", _header([{**X4, "name": "z", "data": [1, 2, 3, 4]}]), {}, "input 'z'"),
    ("missing input", _header([]), {}, "input 'x' is missing"),
    ("classification", _header([{**X4, "data": [1, 2, 3, 4]}], outputs=[{"name": "y", "parameters":
                                                                          {"classification": 2}}]),
     {}, "classification extension"),
    ("wrong datatype", _header([{**X4, "datatype": "INT32", "data": [1, 2, 3, 4]}]), {}, "datatype"),
    ("wrong fixed dim", _header([{**X4, "shape": [1, 5], "data": [1, 2, 3, 4, 5]}]), {}, "input 'x'"),
    ("json count", _header([{**X4, "data": [1, 2, 3]}]), {}, "input 'x'"),
    ("json type", _header([{**X4, "data": ["a", "b", "c", "d"]}]), {}, "input 'x'"),
    ("binary size", _header([{**X4, "parameters": {"binary_data_size": 12}}]) + b"\0" * 12,
     {"hl": True}, "input 'x'"),
    ("body shorter than sizes", _header([{**X4, "parameters": {"binary_data_size": 16}}]) + b"\0" * 8,
     {"hl": True}, "input 'x'"),
    ("unknown output", _header([{**X4, "data": [1, 2, 3, 4]}], outputs=[{"name": "nope"}]), {}, "'nope'"),
    ("fp16 as json", _header([{**X4, "datatype": "FP16", "data": [1, 2, 3, 4]}]), {}, "input 'x'"),
    ("datatype not a string", _header([{**X4, "datatype": ["FP32"], "data": [1, 2, 3, 4]}]), {},
     "unknown datatype ['FP32']"),
    ("header length not a number", _header([{**X4, "data": [1, 2, 3, 4]}]),
     {"Inference-Header-Content-Length": "ten"}, "Inference-Header-Content-Length"),
    ("header length not ascii digits", _header([{**X4, "data": [1, 2, 3, 4]}]),
     {"Inference-Header-Content-Length": "\u00b2"}, "Inference-Header-Content-Length"),
    ("header length past body", _header([{**X4, "data": [1, 2, 3, 4]}]),
     {"Inference-Header-Content-Length": "99999"}, "Inference-Header-Content-Length"),
    ("raw binary wrong size", b"\0" * 15, {"Inference-Header-Content-Length": "0"}, "input 'x'"),
    ("bad gzip", b"not gzip", {"Content-Encoding": "gzip"}, "could not be read as gzip"),
    ("unsupported encoding", b"x", {"Content-Encoding": "br"}, "Content-Encoding 'br' is not supported"),
    ("the daemon's arena parameter", _header([{**X4, "data": [1, 2, 3, 4]}],
                                             parameters={"cartonstore_arena_outputs": {"offset": 0, "byte_size": 8}}),
     {}, "parameter 'cartonstore_arena_outputs' is reserved for the daemon"),
]


@pytest.mark.parametrize(("body", "headers", "fragment"), [c[1:] for c in BAD_REQUESTS],
                         ids=[c[0] for c in BAD_REQUESTS])
def test_malformed_requests_never_reach_the_runner(served: DaemonProcess, body: bytes, headers: dict,
                                                   fragment: str) -> None:
    if headers.pop("hl", False):
        headers = {"Inference-Header-Content-Length": str(body.index(b"}]}") + 3)}
    before = runner_count(served, "affine")
    status, _, answer = raw_post(served, "/v2/models/affine/infer", body, dict(headers))
    assert status == 400, answer
    assert fragment in json.loads(answer)["error"]
    assert runner_count(served, "affine") == before


def test_bytes_framing_is_checked_by_the_daemon(served: DaemonProcess) -> None:
    tensor = {"name": "x_string", "datatype": "BYTES", "shape": [1, 2], "parameters": {"binary_data_size": 9}}
    header = _header([tensor])
    body = header + (5).to_bytes(4, "little") + b"abcde"   # 2 elements declared, 1 framed
    before = runner_count(served, "echo")
    status, _, answer = raw_post(served, "/v2/models/echo/infer", body,
                                 {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "x_string" in json.loads(answer)["error"]
    assert runner_count(served, "echo") == before


def test_symbols_bind_one_value_across_inputs(served: DaemonProcess) -> None:
    c = triton.InferenceServerClient(served.host_port)
    try:
        a = triton.InferInput("x_int8", [2, 3], "INT8")
        a.set_data_from_numpy(sample("int8"))
        b = triton.InferInput("x_uint8", [3, 3], "UINT8")
        b.set_data_from_numpy(sample("uint8", (3, 3)))
        rest = [i for i in inputs_for(DTYPES, True) if i.name() not in ("x_int8", "x_uint8")]
        with pytest.raises(InferenceServerException, match="'n'"):
            c.infer("echo", [a, b, *rest])
    finally:
        c.close()


def test_unknown_and_unready_models(served: DaemonProcess) -> None:
    status, _, body = raw_post(served, "/v2/models/nope/infer", b"{}", {})
    assert status == 404 and "Request for unknown model: 'nope' is not found" in json.loads(body)["error"]
    status, _, body = raw_post(served, "/v2/models/affine/versions/" + "0" * 64 + "/infer", b"{}", {})
    assert status == 404


def test_a_compression_bomb_is_refused_without_growing_the_daemon(served: DaemonProcess) -> None:
    bomb = gzip.compress(b"\0" * (128 << 20), 9)   # 128 KiB that decode to 128 MiB (the limit is 64 MiB)

    async def go() -> None:
        async with unix_session(served.socket_path) as s:
            r = await s.post("/v2/models/affine/infer", data=bomb, headers={"Content-Encoding": "gzip"})
            assert r.status == 413
            assert (await s.get("/v2/health/live")).status == 200
    asyncio.run(go())
    rss_kib = int(next(line.split()[1] for line in Path(f"/proc/{served.proc.pid}/status").read_text().splitlines()
                       if line.startswith("VmHWM:")))
    assert rss_kib < 420 * 1024, f"daemon peaked at {rss_kib // 1024} MiB"  # the 64 MiB limit and change


def test_q_zero_means_no_compression(served: DaemonProcess) -> None:
    doc = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [64, 4], "data": [0.0] * 256}]})

    async def go() -> None:
        async with unix_session(served.socket_path) as s:
            for accept, coding in (("gzip;q=0", None), ("gzip;q=0.0, deflate", "deflate"), ("*", "gzip")):
                r = await s.post("/v2/models/affine/infer", data=doc, headers={"Accept-Encoding": accept},
                                 auto_decompress=False)
                assert r.status == 200 and r.headers.get("Content-Encoding") == coding, accept
    asyncio.run(go())
