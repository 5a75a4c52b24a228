"""Big binary infer requests through the daemon's tensor arena: a real
`cartonstore serve`, real python runners, stock tritonclient on TCP,
aiohttp and raw sockets. Each test checks the arena was (or was not) used
from /metrics, and that every slot is free again afterwards."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from conftest import short_dir
from kit.daemonkit import DaemonProcess, unix_session, wait_for
from kit.inferkit import echo_carton, runner_pids
from kit.peerkit import metric
from test_infer_api import _load, raw_post, runner_count

from cartonstore.v2.framing import parse_infer_response

MIB = 1 << 20
HL = "Inference-Header-Content-Length"

# Outputs of every size against the input: the same, three times it (more than the slot gives outputs),
# two elements, one byte per element, and a string.
GROW_MAIN = '''
import numpy as np

class Grow:
    def infer_with_tensors(self, tensors):
        x = tensors["x"]
        return {"same": x, "triple": np.tile(x, 3), "first": x[:2], "sign": (x > 0).astype(np.uint8),
                "label": np.array(["grown"], dtype=object)}

def get_model():
    return Grow()
'''
GROW_TOML = '''spec_version = 1
model_name = "grow"
[[input]]
name = "x"
dtype = "float32"
shape = ["n"]
''' + "".join(f'[[output]]\nname = "{n}"\ndtype = "{t}"\nshape = {s}\n' for n, t, s in (
    ("same", "float32", '["n"]'), ("triple", "float32", '["*"]'), ("first", "float32", "[2]"),
    ("sign", "uint8", '["n"]'), ("label", "string", "[1]"))) + '''[runner]
runner_name = "python"
required_framework_version = ">=3.8"
runner_compat_version = 1
[runner.opts]
entrypoint_package = "main"
entrypoint_fn = "get_model"
'''


def grow_carton(dest: Path) -> Path:
    (dest / "model").mkdir(parents=True)
    (dest / "carton.toml").write_text(GROW_TOML)
    (dest / "model" / "main.py").write_text(GROW_MAIN)
    return dest


@pytest.fixture(scope="module")
def served() -> Iterator[DaemonProcess]:
    with short_dir() as base:
        config = base / "cartonstore.toml"
        config.write_text('[runners]\nrequest_timeout = "3s"\n')
        d = DaemonProcess(base / "root", extra_args=["--config", str(config)]).start()
        _load(d, "echo", echo_carton(base / "echo", dtypes=["float32", "int64", "string"]))
        _load(d, "grow", grow_carton(base / "grow"))
        yield d
        d.stop()
        assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)


def forwarded(d: DaemonProcess) -> float:
    return metric(d, "cartonstore_arena_requests_total")


def slots_free(d: DaemonProcess) -> bool:
    return wait_for(lambda: metric(d, "cartonstore_arena_slots") == 0, 10)


def _inputs(x: np.ndarray, n: np.ndarray) -> list[triton.InferInput]:
    out = []
    for name, value, datatype in (("x_float32", x, "FP32"), ("x_int64", n, "INT64"),
                                  ("x_string", np.array([[b"a", b"bc"]] * len(x), dtype=object), "BYTES")):
        i = triton.InferInput(name, list(value.shape), datatype)
        i.set_data_from_numpy(value, binary_data=True)
        out.append(i)
    return out


def test_a_big_binary_request_goes_through_the_arena(served: DaemonProcess) -> None:
    x = np.random.default_rng(1).random((2, 512 * 1024), dtype=np.float32)   # 4 MiB
    n = np.arange(2 * 64 * 1024, dtype=np.int64).reshape(2, -1)              # 1 MiB
    before = forwarded(served)
    c = triton.InferenceServerClient(served.host_port)
    try:
        result = c.infer("echo", _inputs(x, n))
    finally:
        c.close()
    assert np.array_equal(result.as_numpy("y_float32"), x)
    assert np.array_equal(result.as_numpy("y_int64"), n)
    assert result.as_numpy("y_string").tolist() == [[b"a", b"bc"]] * 2
    assert forwarded(served) == before + 1
    assert slots_free(served)


def test_concurrent_big_requests_each_get_their_own_answer(served: DaemonProcess) -> None:
    before = forwarded(served)

    async def go() -> None:
        c = triton_aio.InferenceServerClient(served.host_port)
        try:
            xs = [np.full((1, 300_000), k, dtype=np.float32) for k in range(6)]
            ns = [np.full((1, 8), k, dtype=np.int64) for k in range(6)]
            results = await asyncio.gather(*(c.infer("echo", _inputs(x, n)) for x, n in zip(xs, ns, strict=True)))
            for k, result in enumerate(results):
                assert np.array_equal(result.as_numpy("y_float32"), xs[k])
                assert np.array_equal(result.as_numpy("y_int64"), ns[k])
        finally:
            await c.close()
    asyncio.run(go())
    assert forwarded(served) == before + 6
    assert slots_free(served)


def test_outputs_bigger_than_the_slot_gives_come_in_the_body(served: DaemonProcess) -> None:
    x = np.linspace(-1, 1, 256 * 1024, dtype=np.float32)   # 1 MiB; "triple" is 3 MiB
    before = forwarded(served)
    i = triton.InferInput("x", [len(x)], "FP32")
    i.set_data_from_numpy(x)
    outputs = [triton.InferRequestedOutput("same"), triton.InferRequestedOutput("triple"),
               triton.InferRequestedOutput("first", binary_data=False), triton.InferRequestedOutput("sign"),
               triton.InferRequestedOutput("label")]
    c = triton.InferenceServerClient(served.host_port)
    try:
        result = c.infer("grow", [i], outputs=outputs)
    finally:
        c.close()
    assert np.array_equal(result.as_numpy("same"), x)
    assert np.array_equal(result.as_numpy("triple"), np.tile(x, 3))
    assert result.as_numpy("first").tolist() == x[:2].tolist()
    assert "data" in result.get_output("first")
    assert np.array_equal(result.as_numpy("sign"), (x > 0).astype(np.uint8))
    assert result.as_numpy("label").tolist() == [b"grown"]
    assert forwarded(served) == before + 1
    assert slots_free(served)


def test_a_big_raw_binary_request(served: DaemonProcess) -> None:
    x = np.arange(300_000, dtype=np.float32)
    before = forwarded(served)
    status, headers, body = raw_post(served, "/v2/models/grow/infer", x.tobytes(), {HL: "0"})
    assert status == 200, body[:300]
    _doc, arrays = parse_infer_response(body, int(headers[HL]))
    assert np.array_equal(arrays["same"], x) and np.array_equal(arrays["triple"], np.tile(x, 3))
    assert arrays["label"].tolist() == [b"grown"]
    assert forwarded(served) == before + 1
    assert slots_free(served)


def test_a_malformed_big_request_never_reaches_the_runner(served: DaemonProcess) -> None:
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1000],
                                     "parameters": {"binary_data_size": 4 * MIB}}]}).encode()
    before, seen = forwarded(served), runner_count(served, "grow")
    status, _, body = raw_post(served, "/v2/models/grow/infer", header + bytes(4 * MIB), {HL: str(len(header))})
    assert status == 400 and "input 'x'" in json.loads(body)["error"]
    assert runner_count(served, "grow") == seen and forwarded(served) == before
    assert slots_free(served)


@pytest.mark.parametrize(("first", "fragment"), [(-1, "died"), (-2, "did not answer within 3s")])
def test_a_runner_that_fails_a_big_request_frees_its_slot_once_gone(served: DaemonProcess, first: float,
                                                                    fragment: str) -> None:
    x = np.zeros((1, 300_000), dtype=np.float32)
    x[0, 0] = first   # the echo model crashes on -1, hangs on -2 (killed after request_timeout)
    c = triton.InferenceServerClient(served.host_port, network_timeout=30)
    try:
        with pytest.raises(triton.InferenceServerException, match=fragment):
            c.infer("echo", _inputs(x, np.zeros((1, 1), np.int64)))
    finally:
        c.close()
    assert slots_free(served)
    assert wait_for(lambda: _ready(served, "echo"), 20)   # restarted, and serving from the arena again
    before = forwarded(served)
    x[0, 0] = 5
    c = triton.InferenceServerClient(served.host_port)
    try:
        assert np.array_equal(c.infer("echo", _inputs(x, np.zeros((1, 1), np.int64))).as_numpy("y_float32"), x)
    finally:
        c.close()
    assert forwarded(served) == before + 1


def _ready(d: DaemonProcess, name: str) -> bool:
    c = triton.InferenceServerClient(d.host_port)
    try:
        return c.is_model_ready(name)
    finally:
        c.close()


def test_a_slow_reader_holds_its_slot_until_the_answer_left(served: DaemonProcess) -> None:
    x = np.ones(8 * MIB // 4, dtype=np.float32)   # 8 MiB out: more than loopback buffers take at once
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [len(x)],
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "same", "parameters": {"binary_data": True}}]}).encode()
    host, port = served.host_port.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(f"POST /v2/models/grow/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
                     f"{len(header) + x.nbytes}\r\n{HL}: {len(header)}\r\n\r\n".encode() + header + x.tobytes())
        assert wait_for(lambda: metric(served, "cartonstore_arena_slots") == 1, 10)
        assert not wait_for(lambda: metric(served, "cartonstore_arena_slots") == 0, 0.5)   # not read: held
        got = bytearray()
        while b"\r\n\r\n" not in got or len(got) < got.index(b"\r\n\r\n") + 4 + len(header):
            got += sock.recv(1 << 20)
        head, _, rest = bytes(got).partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        body = bytearray(rest)
        while len(body) < length:
            body += sock.recv(1 << 20)
    answer_length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(HL.lower().encode())))
    _, arrays = parse_infer_response(bytes(body), answer_length)
    assert np.array_equal(arrays["same"], x)
    assert slots_free(served)


def test_the_reserved_parameter_is_refused(served: DaemonProcess) -> None:
    x = np.zeros(300_000, dtype=np.float32)
    for params in ({"cartonstore_arena_outputs": {"offset": 0, "byte_size": 64}},
                   {"cartonstore_arena_outputs": "anything"}):
        header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [len(x)],
                                         "parameters": {"binary_data_size": x.nbytes}}],
                             "parameters": params}).encode()
        seen = runner_count(served, "grow")
        status, _, body = raw_post(served, "/v2/models/grow/infer", header + x.tobytes(), {HL: str(len(header))})
        assert status == 400 and "'cartonstore_arena_outputs' is reserved" in json.loads(body)["error"]
        assert runner_count(served, "grow") == seen
    assert slots_free(served)


def test_a_compressed_answer_joins_the_outputs_from_the_arena(served: DaemonProcess) -> None:
    x = np.arange(300_000, dtype=np.float32)
    before = forwarded(served)

    async def go() -> tuple[int, dict, bytes]:
        async with unix_session(served.socket_path) as s:
            r = await s.post("/v2/models/grow/infer", data=x.tobytes(), headers={HL: "0", "Accept-Encoding": "gzip"})
            return r.status, dict(r.headers), await r.read()   # aiohttp decodes gzip
    status, headers, body = asyncio.run(go())
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    _, arrays = parse_infer_response(body, int(headers[HL]))
    assert np.array_equal(arrays["same"], x) and np.array_equal(arrays["triple"], np.tile(x, 3))
    assert forwarded(served) == before + 1
    assert slots_free(served)


def test_a_client_that_leaves_mid_body_frees_its_slot(served: DaemonProcess) -> None:
    seen = runner_count(served, "grow")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(served.socket_path))
        sock.sendall(f"POST /v2/models/grow/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {4 * MIB}\r\n"
                     f"{HL}: 0\r\n\r\n".encode() + bytes(MIB))
        assert wait_for(lambda: metric(served, "cartonstore_arena_slots") == 1, 10)
    assert slots_free(served)
    assert runner_count(served, "grow") == seen


@contextmanager
def grow_served_with(server_toml: str) -> Iterator[DaemonProcess]:
    """A daemon of its own, configured with ``server_toml`` under [server],
    serving the grow model; no runner of it is left after."""
    with short_dir() as base:
        config = base / "cartonstore.toml"
        config.write_text(f"[server]\n{server_toml}\n")
        with DaemonProcess(base / "root", extra_args=["--config", str(config)]) as d:
            _load(d, "grow", grow_carton(base / "grow"))
            yield d
        assert wait_for(lambda: not runner_pids(d.root), 10)


def test_a_body_the_arena_has_no_room_for_is_copied() -> None:
    with grow_served_with('arena_size = "2MiB"') as d:
        for count, arena_used in ((100_000, True), (400_000, False)):   # 0.4 MB fits twice over; 1.6 MB does not
            x = np.arange(count, dtype=np.float32)
            before, full = forwarded(d), metric(d, "cartonstore_arena_full_total")
            status, headers, body = raw_post(d, "/v2/models/grow/infer", x.tobytes(), {HL: "0"})
            assert status == 200
            assert np.array_equal(parse_infer_response(body, int(headers[HL]))[1]["same"], x)
            assert forwarded(d) == before + arena_used
            assert metric(d, "cartonstore_arena_full_total") == full + (not arena_used)
        assert slots_free(d)


def test_without_an_arena_big_requests_are_copied() -> None:
    with grow_served_with("arena_size = 0") as d:
        x = np.arange(300_000, dtype=np.float32)
        status, headers, body = raw_post(d, "/v2/models/grow/infer", x.tobytes(), {HL: "0"})
        assert status == 200
        assert np.array_equal(parse_infer_response(body, int(headers[HL]))[1]["triple"], np.tile(x, 3))

        async def metrics() -> str:
            async with unix_session(d.socket_path) as s:
                return await (await s.get("/metrics")).text()
        assert "cartonstore_arena" not in asyncio.run(metrics())
