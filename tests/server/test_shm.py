"""Triton's system shared-memory extension through the daemon: stock
tritonclient.http and tritonclient.utils.shared_memory against real runner
processes (the python echo and the ONNX affine model), and every unsafe
use refused with a 400 that names it, before any runner sees the request."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from conftest import short_dir
from kit.daemonkit import DaemonProcess, unix_session, wait_for
from kit.inferkit import echo_carton, echo_toml, onnx_carton, runner_pids, runner_sockets
from test_infer_api import _load, runner_count
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

SHM = "/dev/shm"


SLOW_MAIN = """
import time


class Slow:
    def infer_with_tensors(self, tensors):
        time.sleep(1.0)                   # the client truncates its region meanwhile
        return {"y_float32": tensors["x_float32"] * 2}


def get_model():
    return Slow()
"""


def slow_carton(dest: Path) -> Path:
    (dest / "model").mkdir(parents=True)
    (dest / "carton.toml").write_text(echo_toml("slow", ["float32"]))
    (dest / "model" / "main.py").write_text(SLOW_MAIN)
    return dest


@pytest.fixture(scope="module")
def served() -> Iterator[DaemonProcess]:
    """A daemon that allows shared memory over TCP (tritonclient.http has no
    Unix socket), on a socket any uid can reach (the per-uid tests)."""
    with short_dir() as base, short_dir(prefix="cs-shm-") as sock_dir:
        config = base / "cartonstore.toml"
        config.write_text('[server]\nshared_memory_over_tcp = true\nsocket_mode = "0666"\n')
        sock_dir.chmod(0o755)
        d = DaemonProcess(base / "root", socket_path=sock_dir / "d.sock", extra_args=["--config", str(config)]).start()
        try:
            _load(d, "echo", echo_carton(base / "echo", dtypes=["float32", "string"]))
            _load(d, "affine", onnx_carton(base / "affine"))
            _load(d, "slow", slow_carton(base / "slow"))
            yield d
        finally:
            d.stop()
        assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)


@pytest.fixture
def client(served: DaemonProcess) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(served.host_port)
    yield c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def regions() -> Iterator[Callable[[str, int], Any]]:
    """Shared memory objects made by tritonclient, destroyed (unlinked) after."""
    made: list = []

    def make(name: str, size: int) -> Any:
        handle = shm.create_shared_memory_region(name, f"/cs-test-{os.getpid()}-{name}", size)
        made.append(handle)
        return handle
    yield make
    for handle in made:
        try:
            shm.destroy_shared_memory_region(handle)
        except shm.SharedMemoryException:
            pass


def post(d: DaemonProcess, path: str, doc: object, headers: dict | None = None) -> tuple[int, dict]:
    async def go() -> tuple[int, dict]:
        async with unix_session(d.socket_path) as s:
            r = await s.post(path, data=json.dumps(doc).encode() if doc is not None else b"", headers=headers)
            text = await r.text()
            return r.status, (json.loads(text) if text else {})
    return asyncio.run(go())


def get(d: DaemonProcess, path: str) -> tuple[int, object]:
    async def go() -> tuple[int, object]:
        async with unix_session(d.socket_path) as s:
            r = await s.get(path)
            return r.status, await r.json()
    return asyncio.run(go())


def test_python_runner_inputs_and_outputs_in_shared_memory(client: triton.InferenceServerClient,
                                                           regions) -> None:
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    s = np.array([b"one", b"\xc3\xa9t\xc3\xa9", b""], dtype=object).reshape(3, 1)
    framed = serialize_byte_tensor(s)
    s_size = serialized_byte_size(framed)
    inp, out = regions("in", 4096), regions("out", 4096)
    shm.set_shared_memory_region(inp, [x])
    shm.set_shared_memory_region(inp, [framed], offset=1024)
    client.register_system_shared_memory("in", inp._shm_key, 4096)
    client.register_system_shared_memory("out", inp._shm_key.replace("-in", "-out"), 4096)
    status = client.get_system_shared_memory_status()
    assert sorted((r["name"], r["byte_size"], r["offset"]) for r in status) == [("in", 4096, 0), ("out", 4096, 0)]

    xi = triton.InferInput("x_float32", [3, 4], "FP32")
    xi.set_shared_memory("in", x.nbytes)
    si = triton.InferInput("x_string", [3, 1], "BYTES")
    si.set_shared_memory("in", s_size, offset=1024)
    yo = triton.InferRequestedOutput("y_float32")
    yo.set_shared_memory("out", 2048, offset=512)
    so = triton.InferRequestedOutput("y_string", binary_data=True)  # mixed: this one comes over the socket
    result = client.infer("echo", [xi, si], outputs=[yo, so])
    y = result.get_output("y_float32")
    assert y["parameters"] == {"shared_memory_region": "out", "shared_memory_byte_size": x.nbytes}
    assert "data" not in y
    got = shm.get_contents_as_numpy(out, np.float32, y["shape"], offset=512)
    assert np.array_equal(got, x)
    assert list(result.as_numpy("y_string").reshape(-1)) == list(s.reshape(-1))

    client.unregister_system_shared_memory("in")
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["out"]
    with pytest.raises(InferenceServerException, match="unable to find system shared memory region 'in'"):
        client.infer("echo", [xi, si], outputs=[yo])


def test_onnx_runner_reads_and_writes_shared_memory(client: triton.InferenceServerClient, regions) -> None:
    x = np.random.default_rng(3).standard_normal((256, 4)).astype(np.float32)
    inp, out = regions("onnx-in", x.nbytes), regions("onnx-out", x.nbytes + 64)
    shm.set_shared_memory_region(inp, [x])
    client.register_system_shared_memory("onnx-in", inp._shm_key, x.nbytes)
    client.register_system_shared_memory("onnx-out", inp._shm_key.replace("-in", "-out"), x.nbytes, offset=64)
    i = triton.InferInput("x", list(x.shape), "FP32")
    i.set_shared_memory("onnx-in", x.nbytes)
    o = triton.InferRequestedOutput("y")
    o.set_shared_memory("onnx-out", x.nbytes)
    for _ in range(3):   # the runner maps each region once
        result = client.infer("affine", [i], outputs=[o])
        assert np.allclose(shm.get_contents_as_numpy(out, np.float32, x.shape, offset=64), x * 2 + 1)
    assert result.get_output("y")["parameters"]["shared_memory_region"] == "onnx-out"


def test_an_output_too_big_for_its_region(client: triton.InferenceServerClient, regions) -> None:
    x = np.ones((8, 4), np.float32)
    inp, _ = regions("small-in", x.nbytes), regions("small-out", 16)
    shm.set_shared_memory_region(inp, [x])
    client.register_system_shared_memory("small-in", inp._shm_key, x.nbytes)
    client.register_system_shared_memory("small-out", inp._shm_key.replace("-in", "-out"), 16)
    i = triton.InferInput("x", [8, 4], "FP32")
    i.set_shared_memory("small-in", x.nbytes)
    o = triton.InferRequestedOutput("y")
    o.set_shared_memory("small-out", 16)
    with pytest.raises(InferenceServerException,
                       match="output 'y': shared memory region 'small-out' gives it 16 bytes, but it needs 128"):
        client.infer("affine", [i], outputs=[o])


def _make_object(name: str, size: int, mode: int = 0o600) -> str:
    key = f"/cs-test-{os.getpid()}-{name}"
    fd = os.open(f"{SHM}{key}", os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
    os.ftruncate(fd, size)
    os.close(fd)
    return key


@pytest.fixture
def objects() -> Iterator[Callable[[str, int], str]]:
    keys: list[str] = []

    def make(name: str, size: int) -> str:
        keys.append(_make_object(name, size))
        return keys[-1]
    yield make
    for key in keys:
        Path(SHM + key).unlink(missing_ok=True)


def test_bad_registrations_name_the_problem(served: DaemonProcess, objects, tmp_path: Path) -> None:
    key = objects("reg", 4096)
    link = Path(f"{SHM}/cs-test-{os.getpid()}-link")
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_bytes(b"\0" * 4096)
    base = "/v2/systemsharedmemory/region"
    try:
        cases = [
            ({"key": "/dev/shm" + key, "offset": 0, "byte_size": 8}, "is not a POSIX shared memory object name"),
            ({"key": "/../etc/passwd", "offset": 0, "byte_size": 8}, "is not a POSIX shared memory object name"),
            ({"key": key + "-missing", "offset": 0, "byte_size": 8}, "no shared memory object"),
            ({"key": "/" + link.name, "offset": 0, "byte_size": 8}, "cannot open shared memory object"),
            ({"key": key, "offset": 4000, "byte_size": 200}, "runs past the end of the 4096-byte object"),
            ({"key": key, "offset": 0, "byte_size": 0}, "byte_size must be an integer > 0"),
            ({"key": key, "offset": -1, "byte_size": 8}, "offset must be an integer >= 0"),
            ({"key": key, "byte_size": 8, "extra": 1}, "unknown field(s) in the register request: extra"),
            ({"key": 5, "byte_size": 8}, '"key" must be a non-empty string'),
            ({"key": "/\ud800x", "byte_size": 8}, "is not valid UTF-8 text"),
            ([1, 2], "request body must be a JSON object"),
        ]
        for doc, fragment in cases:
            status, answer = post(served, f"{base}/bad/register", doc)
            assert status == 400 and fragment in answer["error"], (doc, answer)
        assert get(served, "/v2/systemsharedmemory/status") == (200, [])
        assert post(served, f"{base}/good/register", {"key": key, "byte_size": 4096})[0] == 200
        status, answer = post(served, f"{base}/good/register", {"key": key, "byte_size": 16})
        assert status == 400 and "'good' is already registered" in answer["error"]
        status, answer = get(served, f"{base}/nope/status")
        assert status == 400 and "unable to find system shared memory region: 'nope'" in answer["error"]
        status, answer = post(served, f"{base}/good/unregister", {"x": 1})
        assert status == 400 and "empty body" in answer["error"]
        assert post(served, f"{base}/never-registered/unregister", None)[0] == 200   # as Triton: no error
        assert post(served, "/v2/systemsharedmemory/unregister", None)[0] == 200
        assert get(served, "/v2/systemsharedmemory/status") == (200, [])
    finally:
        link.unlink()


def _shm_request(region: str, byte_size: int, offset: int = 0, out: str | None = None) -> dict:
    doc: dict = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4],
                             "parameters": {"shared_memory_region": region, "shared_memory_byte_size": byte_size,
                                            "shared_memory_offset": offset}}]}
    if out is not None:
        doc["outputs"] = [{"name": "y", "parameters": {"shared_memory_region": out,
                                                       "shared_memory_byte_size": 32}}]
    return doc


def test_requests_that_misuse_a_region_never_reach_the_runner(served: DaemonProcess, objects) -> None:
    key = objects("use", 64)
    assert post(served, "/v2/systemsharedmemory/region/use/register", {"key": key, "byte_size": 48, "offset": 16})[0] == 200
    before = runner_count(served, "affine")
    cases = [
        (_shm_request("nope", 32), "input 'x': unable to find system shared memory region 'nope'"),
        (_shm_request("use", 32, offset=24), "shared_memory_offset 24 + shared_memory_byte_size 32 runs past "
                                             "the end of region 'use' (48 bytes)"),
        (_shm_request("use", 12), "input 'x': shared_memory_byte_size 12 does not match shape [2, 4] of FP32"),
        (_shm_request("use", 32, out="nope"), "requested output 'y': unable to find system shared memory region"),
    ]
    for doc, fragment in cases:
        status, answer = post(served, "/v2/models/affine/infer", doc)
        assert status == 400 and fragment in answer["error"], (doc, answer)
    assert runner_count(served, "affine") == before
    status, answer = post(served, "/v2/models/affine/infer", _shm_request("use", 32, out="use"))
    assert status == 200, answer
    assert post(served, "/v2/systemsharedmemory/unregister", None)[0] == 200


def test_a_region_truncated_or_unlinked_under_the_daemon(served: DaemonProcess, objects) -> None:
    key = objects("gone", 4096)
    for name in ("trunc", "unlinked"):
        assert post(served, f"/v2/systemsharedmemory/region/{name}/register", {"key": key, "byte_size": 4096})[0] == 200
    status, answer = post(served, "/v2/models/affine/infer", _shm_request("trunc", 32, out="trunc"))
    assert status == 200, answer    # the runner has mapped it now
    pids = runner_pids(served.root)
    os.truncate(SHM + key, 16)
    status, answer = post(served, "/v2/models/affine/infer", _shm_request("trunc", 32, out="trunc"))
    assert status == 400 and "region 'trunc' cannot be used: its object" in answer["error"] \
        and "(truncated)" in answer["error"], answer
    Path(SHM + key).unlink()
    status, answer = post(served, "/v2/models/affine/infer", _shm_request("unlinked", 32))
    assert status == 400 and f"its object {key!r} was unlinked" in answer["error"], answer
    assert runner_pids(served.root) == pids and served.proc.poll() is None   # nothing crashed
    assert post(served, "/v2/systemsharedmemory/unregister", None)[0] == 200


def test_unregister_unmaps_the_region_in_the_runner(served: DaemonProcess, objects) -> None:
    key = objects("unmap", 64)
    assert post(served, "/v2/systemsharedmemory/region/unmap/register", {"key": key, "byte_size": 64})[0] == 200
    assert post(served, "/v2/models/affine/infer", _shm_request("unmap", 32, out="unmap"))[0] == 200
    sock = next(p for p in runner_sockets(served.root) if p.name.startswith("affine.g"))

    def runner_regions() -> list:
        async def go() -> list:
            async with unix_session(sock) as s:
                return await (await s.get("/v2/systemsharedmemory/status")).json()
        return asyncio.run(go())
    (mapped,) = runner_regions()
    assert mapped["key"] == key and mapped["name"] != "unmap"   # the daemon's own name for it
    assert post(served, "/v2/systemsharedmemory/region/unmap/unregister", None)[0] == 200
    assert wait_for(lambda: runner_regions() == [], 5)


@pytest.mark.slow
def test_shared_memory_is_refused_over_tcp_by_default(short_tmp: Path, objects) -> None:
    key = objects("tcp", 64)
    with DaemonProcess(short_tmp / "root") as d:
        c = triton.InferenceServerClient(d.host_port)
        try:
            with pytest.raises(InferenceServerException, match="served only on the daemon's Unix socket"):
                c.register_system_shared_memory("r", key, 64)
            with pytest.raises(InferenceServerException, match="served only on the daemon's Unix socket"):
                c.get_system_shared_memory_status()
        finally:
            c.close()
        assert post(d, "/v2/systemsharedmemory/region/r/register", {"key": key, "byte_size": 64})[0] == 200


NOBODY = 65534


def _call_unix(path: str, method: str, target: str, doc: object = None) -> tuple[int, object]:
    """One request with nothing but a socket (in a forked child: no event loop, no new imports)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        body = b"" if doc is None else json.dumps(doc).encode()
        s.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                  f"Connection: close\r\n\r\n".encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), (json.loads(rest) if rest else None)


def _as_nobody(path: str, key_mine: str, key_root: str) -> dict:
    fd = os.open(SHM + key_mine, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.ftruncate(fd, 64)
    os.pwrite(fd, struct.pack("<8f", *range(8)), 0)
    use_roots = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "parameters": {
        "shared_memory_region": "root-only", "shared_memory_byte_size": 32}}]}
    try:
        return {
            "register_mine": _call_unix(path, "POST", "/v2/systemsharedmemory/region/r/register",
                                        {"key": key_mine, "byte_size": 64}),
            "register_roots": _call_unix(path, "POST", "/v2/systemsharedmemory/region/s/register",
                                         {"key": key_root, "byte_size": 64}),
            "status": _call_unix(path, "GET", "/v2/systemsharedmemory/status"),
            "infer_mine": _call_unix(path, "POST", "/v2/models/echo/infer", {
                "inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [2, 4], "parameters": {
                    "shared_memory_region": "r", "shared_memory_byte_size": 32}},
                    {"name": "x_string", "datatype": "BYTES", "shape": [2, 1], "data": ["s", "t"]}],
                "outputs": [{"name": "y_float32", "parameters": {"shared_memory_region": "r",
                             "shared_memory_byte_size": 32, "shared_memory_offset": 32}}]}),
            "output": [list(os.pread(fd, 32, 32))],
            "use_roots": _call_unix(path, "POST", "/v2/models/affine/infer", use_roots),
            "unregister_all": _call_unix(path, "POST", "/v2/systemsharedmemory/unregister"),
        }
    finally:
        os.close(fd)
        os.unlink(SHM + key_mine)


def run_as(uid: int, fn, *args: object) -> object:
    """fn(*args) in a forked child running as ``uid``; its JSON result."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: report, never return into pytest
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.write(write_end, json.dumps(fn(*args)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and out, out
    return json.loads(out)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
def test_each_uid_sees_and_uses_only_its_own_regions(served: DaemonProcess, objects) -> None:
    key_root = objects("root", 64)
    assert post(served, "/v2/systemsharedmemory/region/root-only/register", {"key": key_root, "byte_size": 64})[0] == 200
    key_mine = f"/cs-test-{os.getpid()}-nobody"
    out = {k: tuple(v) for k, v in run_as(NOBODY, _as_nobody, str(served.socket_path), key_mine, key_root).items()}
    assert out["register_mine"] == (200, None)
    assert out["register_roots"][0] == 400 and "belongs to uid 0, not your uid 65534" in out["register_roots"][1]["error"]
    assert out["status"] == (200, [{"name": "r", "key": key_mine, "offset": 0, "byte_size": 64}])
    # its own region works, the runner copying its inputs (another uid's truncation must not SIGBUS it)
    assert out["infer_mine"][0] == 200, out["infer_mine"]
    assert np.frombuffer(bytes(out["output"][0]), "<f4").tolist() == list(range(8))
    assert out["use_roots"][0] == 400 and "unable to find system shared memory region 'root-only'" in \
        out["use_roots"][1]["error"]
    assert out["unregister_all"][0] == 200
    # nobody's unregister-all left root's region alone
    assert [r["name"] for r in get(served, "/v2/systemsharedmemory/status")[1]] == ["root-only"]
    assert post(served, "/v2/systemsharedmemory/unregister", None)[0] == 200


def test_the_daemon_never_maps_a_region(served: DaemonProcess, objects) -> None:
    key = objects("nomap", 64)
    assert post(served, "/v2/systemsharedmemory/region/nomap/register", {"key": key, "byte_size": 64})[0] == 200
    assert post(served, "/v2/models/affine/infer", _shm_request("nomap", 32, out="nomap"))[0] == 200
    maps = Path(f"/proc/{served.proc.pid}/maps").read_text()
    assert key not in maps      # only runners map; the daemon cannot be SIGBUSed by a truncation
    assert post(served, "/v2/systemsharedmemory/unregister", None)[0] == 200


def test_a_region_truncated_while_the_model_reads_it(served: DaemonProcess, objects) -> None:
    """The one crash a client can cause: SIGBUS in the runner that maps its
    region. The daemon (which never maps) answers 503 saying so, and the
    runner is restarted."""
    key = objects("race", 1 << 20)
    assert post(served, "/v2/systemsharedmemory/region/race/register", {"key": key, "byte_size": 1 << 20})[0] == 200
    doc = {"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [512, 512], "parameters": {
        "shared_memory_region": "race", "shared_memory_byte_size": 1 << 20}}]}
    pids = set(runner_pids(served.root))

    async def go() -> tuple[int, dict]:
        async with unix_session(served.socket_path) as s:
            answer = asyncio.ensure_future(s.post("/v2/models/slow/infer", json=doc))
            await asyncio.sleep(0.5)   # halfway into the model's 1 s over its mapped inputs (nothing shows the moment)
            os.truncate(SHM + key, 0)
            r = await answer
            return r.status, await r.json()
    status, answer = asyncio.run(go())
    assert status == 503 and "SIGBUS" in answer["error"] and "truncated" in answer["error"], answer
    assert served.proc.poll() is None
    def ready() -> bool:
        async def go() -> int:
            async with unix_session(served.socket_path) as s:
                return (await s.get("/v2/models/slow/ready")).status
        return asyncio.run(go()) == 200
    assert wait_for(ready, 20)
    assert set(runner_pids(served.root)) != pids        # a new runner took the dead one's place
    assert post(served, "/v2/systemsharedmemory/unregister", None)[0] == 200


def test_bytes_in_shared_memory_are_bounded_before_they_are_read(served: DaemonProcess, objects) -> None:
    key = objects("huge", 300 << 20)   # sparse: no memory behind it
    assert post(served, "/v2/systemsharedmemory/region/huge/register", {"key": key, "byte_size": 300 << 20})[0] == 200
    x = {"name": "x_float32", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}

    def strings(shape: list, size: int) -> dict:
        return {"inputs": [x, {"name": "x_string", "datatype": "BYTES", "shape": shape, "parameters": {
            "shared_memory_region": "huge", "shared_memory_byte_size": size}}]}
    status, answer = post(served, "/v2/models/echo/infer", strings([1, 1], 300 << 20))
    assert status == 400 and "more than server.max_request_size (268435456) allows" in answer["error"], answer
    status, answer = post(served, "/v2/models/echo/infer", strings([1, 4], 12))
    assert status == 400 and "cannot hold 4 BYTES elements" in answer["error"], answer
    status, answer = post(served, "/v2/models/echo/infer", strings([1, 1], 8))
    assert status == 400 and "input 'x_string'" in answer["error"], answer    # zeros: a 0-length element + 4 stray
    assert post(served, "/v2/systemsharedmemory/unregister", None)[0] == 200


def test_bytes_outputs_written_into_shared_memory(client: triton.InferenceServerClient, regions) -> None:
    s = np.array([b"alpha", b"", "\u00e9t\u00e9".encode()], dtype=object).reshape(3, 1)
    x = np.zeros((3, 1), np.float32)
    out = regions("bytes-out", 256)
    client.register_system_shared_memory("bytes-out", out._shm_key, 256)
    xi = triton.InferInput("x_float32", [3, 1], "FP32")
    xi.set_data_from_numpy(x)
    si = triton.InferInput("x_string", [3, 1], "BYTES")
    si.set_data_from_numpy(s)
    so = triton.InferRequestedOutput("y_string")
    so.set_shared_memory("bytes-out", 256)
    result = client.infer("echo", [xi, si], outputs=[so])
    y = result.get_output("y_string")
    assert y["parameters"]["shared_memory_byte_size"] == sum(4 + len(v) for v in s.reshape(-1))
    got = shm.get_contents_as_numpy(out, np.object_, y["shape"])
    assert list(got.reshape(-1)) == list(s.reshape(-1))


def test_concurrent_first_uses_of_a_region_map_it_once(served: DaemonProcess, objects) -> None:
    """Eight requests race to be the first to use a region on a runner: one
    registration is made, every request waits for it, none fails."""
    key = objects("race-first", 64)
    assert post(served, "/v2/systemsharedmemory/region/first/register", {"key": key, "byte_size": 64})[0] == 200

    async def go() -> list[int]:
        async with unix_session(served.socket_path) as s:
            async def one() -> int:
                r = await s.post("/v2/models/affine/infer", json=_shm_request("first", 32, out="first"))
                await r.read()
                return r.status
            return await asyncio.gather(*(one() for _ in range(8)))
    assert asyncio.run(go()) == [200] * 8
    mapped = [r for r in _runner_call(served, "GET", "/v2/systemsharedmemory/status")[1] if r["key"] == key]
    assert len(mapped) == 1
    assert post(served, "/v2/systemsharedmemory/unregister", None)[0] == 200


def _runner_call(d: DaemonProcess, method: str, path: str, doc: object = None) -> tuple[int, object]:
    sock = next(p for p in runner_sockets(d.root) if p.name.startswith("affine.g"))

    async def go() -> tuple[int, object]:
        async with unix_session(sock) as s:
            r = await s.request(method, path, json=doc)
            text = await r.text()
            return r.status, (json.loads(text) if text else None)
    return asyncio.run(go())


def test_a_runner_registers_only_the_object_the_daemon_checked(served: DaemonProcess, objects) -> None:
    """The runner's side of registration, spoken to directly: a repeat of
    the same registration is fine, a different one under the name is not,
    and an object replaced under its key since the daemon's check is refused."""
    key = objects("direct", 64)
    st = os.stat(SHM + key)
    doc = {"key": key, "offset": 0, "byte_size": 64, "cartonstore_object": [st.st_dev, st.st_ino]}
    base = "/v2/systemsharedmemory/region/direct"
    assert _runner_call(served, "POST", base + "/register", doc)[0] == 200
    assert _runner_call(served, "POST", base + "/register", doc)[0] == 200          # a retry
    status, answer = _runner_call(served, "POST", base + "/register", {**doc, "byte_size": 32})
    assert status == 400 and "'direct' is already registered" in answer["error"]
    status, answer = _runner_call(served, "POST", "/v2/systemsharedmemory/region/other/register",
                                  {**doc, "cartonstore_object": [st.st_dev, st.st_ino + 1]})
    assert status == 400 and "now names another object than the one the daemon checked" in answer["error"]
    status, answer = _runner_call(served, "POST", "/v2/systemsharedmemory/region/other/register",
                                  {"key": key, "byte_size": 0})
    assert status == 400 and "byte_size must be an integer > 0" in answer["error"]
    assert _runner_call(served, "POST", base + "/unregister")[0] == 200
    assert "direct" not in [r["name"] for r in _runner_call(served, "GET", "/v2/systemsharedmemory/status")[1]]
