"""The v2 gRPC service driven by stock tritonclient.grpc (sync, streaming
and asyncio) and by raw service_pb2 messages, against a real `cartonstore
serve` with real onnxruntime and python runners: raw and typed contents,
BYTES, system shared memory, streams, the repository, statistics and
config, and every malformed request refused with INVALID_ARGUMENT before
any runner sees it."""

from __future__ import annotations

import asyncio
import json
import os
import queue
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tg_aio
import tritonclient.utils.shared_memory as shm
from conftest import short_dir
from kit.daemonkit import DaemonProcess, wait_for
from kit.inferkit import echo_carton, onnx_carton, runner_pids, runner_sockets, sample
from kit.ocikit import make_cert
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from cartonstore.cli.commands import main

pytestmark = pytest.mark.xdist_group("grpc")


@pytest.fixture(scope="module")
def served() -> Iterator[DaemonProcess]:
    """One daemon for the module, gRPC on its Unix socket and a loopback
    port; models: affine (onnx, y = 2x + 1 on float32 [N, 4]) and echo
    (python, y_<t> = x_<t> for float32, int8 and string)."""
    with short_dir() as base:
        d = DaemonProcess(base / "root", extra_args=["--grpc-listen", "127.0.0.1:0"]).start()
        try:
            for name, src in (("affine", onnx_carton(base / "src" / "affine")),
                              ("echo", echo_carton(base / "src" / "echo", dtypes=["float32", "int8", "string"]))):
                assert main(["add", str(src), "--name", name, "--root", str(d.root), "--progress", "none"]) == 0
            c = tg.InferenceServerClient(d.grpc_unix)
            c.load_model("affine")
            c.load_model("echo")
            c.close()
            yield d
        finally:
            d.stop()
            assert not runner_pids(d.root)


def _x(x: np.ndarray, name: str = "x", datatype: str = "FP32") -> tg.InferInput:
    tensor = tg.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    return tensor


def _runner_seen(d: DaemonProcess, name: str) -> int:
    """Requests the runner itself has counted (its own statistics route)."""
    import http.client
    import socket

    sock_path = next(p for p in runner_sockets(d.root) if p.name.startswith(name + ".g"))

    class Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(str(sock_path))
    conn = Conn("runner")
    conn.request("GET", f"/v2/models/{name}/stats")
    stats = json.loads(conn.getresponse().read())["model_stats"][0]["inference_stats"]
    conn.close()
    return stats["success"]["count"] + stats["fail"]["count"]


def _private_dirs(pid: int) -> set[Path]:
    """The directories of the Unix sockets process ``pid`` listens on under /tmp/cartonstore-grpc-*."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    out = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes and "/cartonstore-grpc-" in fields[7]:
            out.add(Path(fields[7]).parent)
    return out


def test_infer_over_the_unix_socket_and_tcp(served: DaemonProcess) -> None:
    for url in (served.grpc_unix, served.grpc_host_port):
        c = tg.InferenceServerClient(url)
        assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("affine")
        meta = c.get_server_metadata()
        assert meta.name == "cartonstore" and "statistics" in meta.extensions
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        out = c.infer("affine", [_x(x)], request_id="r1")
        assert out.get_response().id == "r1" and out.get_response().model_name == "affine"
        np.testing.assert_array_equal(out.as_numpy("y"), x * 2 + 1)
        md = c.get_model_metadata("affine")
        assert md.platform == "onnxruntime_onnx" and md.inputs[0].name == "x" and list(md.inputs[0].shape) == [-1, 4]
        c.close()


def test_typed_contents_bytes_and_requested_outputs(served: DaemonProcess) -> None:
    channel = grpc.insecure_channel(served.grpc_unix)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    req = pb.ModelInferRequest(model_name="echo")
    f = req.inputs.add(name="x_float32", datatype="FP32", shape=[2, 2])
    f.contents.fp32_contents.extend([1.5, 2.5, -3.0, 4.0])
    i8 = req.inputs.add(name="x_int8", datatype="INT8", shape=[2, 2])
    i8.contents.int_contents.extend([-128, 0, 127, 1])
    s = req.inputs.add(name="x_string", datatype="BYTES", shape=[2, 1])
    s.contents.bytes_contents.extend([b"caf\xc3\xa9", b""])
    req.outputs.add(name="y_int8")
    req.outputs.add(name="y_string")
    resp = stub.ModelInfer(req)
    assert [o.name for o in resp.outputs] == ["y_int8", "y_string"]
    assert [o.datatype for o in resp.outputs] == ["INT8", "BYTES"]
    assert np.frombuffer(resp.raw_output_contents[0], np.int8).tolist() == [-128, 0, 127, 1]
    assert resp.raw_output_contents[1] == b"\x05\0\0\0caf\xc3\xa9\0\0\0\0"
    channel.close()
    # BYTES through the stock client, raw contents
    c = tg.InferenceServerClient(served.grpc_unix)
    strings = sample("string", (2, 3))
    inputs = [_x(sample("float32"), "x_float32"), _x(sample("int8"), "x_int8", "INT8"),
              _x(strings, "x_string", "BYTES")]
    out = c.infer("echo", inputs, outputs=[tg.InferRequestedOutput("y_string")])
    assert out.as_numpy("y_string").tolist() == strings.tolist()
    c.close()


def _malformed() -> list[tuple[str, pb.ModelInferRequest, str]]:
    cases = []

    def case(words: str, model: str = "affine") -> pb.ModelInferRequest:
        req = pb.ModelInferRequest(model_name=model)
        cases.append((words, req, words))
        return req

    four = np.ones(4, np.float32).tobytes()
    r = case("shape")                                      # the data does not fill the declared shape
    r.inputs.add(name="x", datatype="FP32", shape=[1, 5])
    r.raw_input_contents.append(np.ones(5, np.float32).tobytes())
    r = case("datatype")                                   # carton.toml says float32
    r.inputs.add(name="x", datatype="INT32", shape=[1, 4])
    r.raw_input_contents.append(four)
    r = case("raw_input_contents has 2 entries")
    r.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    r.raw_input_contents.extend([four, four])
    r = case("either in raw_input_contents or in contents")
    t = r.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    t.contents.fp32_contents.extend([1, 2, 3, 4])
    r.raw_input_contents.append(four)
    r = case("not int_contents")
    r.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.int_contents.extend([1, 2, 3, 4])
    r = case("outside INT8's range", "echo")
    r.inputs.add(name="x_int8", datatype="INT8", shape=[1]).contents.int_contents.append(300)
    r = case("FP16 has no typed contents field")
    r.inputs.add(name="x", datatype="FP16", shape=[1, 4])
    r = case("'binary_data_size' belongs to the HTTP binary tensor form")
    t = r.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    t.parameters["binary_data_size"].int64_param = 16
    r.raw_input_contents.append(four)
    r = case("'z'")                                        # no such input
    r.inputs.add(name="z", datatype="FP32", shape=[1, 4])
    r.raw_input_contents.append(four)
    r = case("'x'")                                        # the input the model needs is missing
    r = case("'nope'")                                     # no such output
    r.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    r.raw_input_contents.append(four)
    r.outputs.add(name="nope")
    r = case("unable to find system shared memory region 'ghost'")
    t = r.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    t.parameters["shared_memory_region"].string_param = "ghost"
    t.parameters["shared_memory_byte_size"].int64_param = 16
    r = case("classification extension")                   # would be top-k labels in Triton: refused by name
    r.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    r.raw_input_contents.append(four)
    r.outputs.add(name="y").parameters["classification"].int64_param = 2
    r = case("cartonstore_arena_outputs")                  # the daemon's own parameter
    r.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    r.raw_input_contents.append(four)
    r.parameters["cartonstore_arena_outputs"].string_param = "{}"
    return cases


def test_every_malformed_request_is_refused_before_the_runner(served: DaemonProcess) -> None:
    seen = {name: _runner_seen(served, name) for name in ("affine", "echo")}
    channel = grpc.insecure_channel(served.grpc_unix)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    for words, req, _ in _malformed():
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(req)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (words, caught.value.details())
        assert words.lower() in caught.value.details().lower(), (words, caught.value.details())
    assert {name: _runner_seen(served, name) for name in seen} == seen
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(pb.ModelInferRequest(model_name="nope"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "Request for unknown model: 'nope' is not found" in caught.value.details()
    channel.close()


def test_system_shared_memory_round_trip(served: DaemonProcess) -> None:
    c = tg.InferenceServerClient(served.grpc_unix)
    c.unregister_cuda_shared_memory()    # as Triton's shared-memory examples start
    c.unregister_system_shared_memory()
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    key = f"/cs-grpc-{os.getpid()}"
    handle = shm.create_shared_memory_region("io", key, 1024)
    try:
        shm.set_shared_memory_region(handle, [x])
        c.register_system_shared_memory("io", key, 1024)
        status = c.get_system_shared_memory_status()
        assert status.regions["io"].key == key and status.regions["io"].byte_size == 1024
        xi = tg.InferInput("x", [2, 4], "FP32")
        xi.set_shared_memory("io", x.nbytes)
        yo = tg.InferRequestedOutput("y")
        yo.set_shared_memory("io", x.nbytes, offset=512)
        out = c.infer("affine", [xi], outputs=[yo])
        y = out.get_output("y")
        assert y.parameters["shared_memory_region"].string_param == "io"
        got = shm.get_contents_as_numpy(handle, np.float32, [2, 4], offset=512)
        np.testing.assert_array_equal(got, x * 2 + 1)
        # a TCP caller is not the Unix socket's uid: it sees no region, and may not use shared memory at all
        tcp = tg.InferenceServerClient(served.grpc_host_port)
        with pytest.raises(InferenceServerException, match="served only on the daemon's Unix socket"):
            tcp.get_system_shared_memory_status()
        with pytest.raises(InferenceServerException, match="served only on the daemon's Unix socket"):
            tcp.infer("affine", [xi], outputs=[yo])
        tcp.close()
        c.unregister_system_shared_memory("io")
        assert not c.get_system_shared_memory_status().regions
    finally:
        shm.destroy_shared_memory_region(handle)
        c.close()


def test_streaming_infer_answers_in_order_and_goes_on_after_an_error(served: DaemonProcess) -> None:
    c = tg.InferenceServerClient(served.grpc_unix)
    answers: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    for i in range(20):
        x = np.full((1, 4), i, np.float32) if i != 7 else np.ones((1, 5), np.float32)
        c.async_stream_infer("affine", [_x(x)], request_id=str(i))
    c.stop_stream()
    got = [answers.get(timeout=10) for _ in range(20)]
    for i, (result, error) in enumerate(got):
        if i == 7:
            assert result is None and "shape" in str(error)
            continue
        assert error is None and result.get_response().id == str(i)
        np.testing.assert_array_equal(result.as_numpy("y"), np.full((1, 4), 2 * i + 1, np.float32))
    c.close()


def test_asyncio_client_repository_statistics_and_config(served: DaemonProcess) -> None:
    async def run() -> None:
        c = tg_aio.InferenceServerClient(served.grpc_unix)
        try:
            index = await c.get_model_repository_index()
            assert {m.name: m.state for m in index.models} == {"affine": "READY", "echo": "READY"}
            before = (await c.get_inference_statistics("affine")).model_stats[0].inference_stats.success.count
            x = np.ones((3, 4), np.float32)
            out = await c.infer("affine", [_x(x)])
            np.testing.assert_array_equal(out.as_numpy("y"), x * 2 + 1)

            async def requests() -> AsyncIterator[dict[str, Any]]:
                for i in range(5):
                    yield {"model_name": "affine", "inputs": [_x(np.full((1, 4), i, np.float32))],
                           "request_id": str(i)}
            ids = []
            async for result, error in c.stream_infer(requests()):
                assert error is None
                ids.append(result.get_response().id)
            assert ids == [str(i) for i in range(5)]
            stats = (await c.get_inference_statistics("affine")).model_stats[0]
            assert stats.inference_stats.success.count == before + 6 and stats.inference_stats.compute_infer.ns > 0
            await c.load_model("affine", config=json.dumps({"max_batch_size": 4}))
            config = (await c.get_model_config("affine")).config
            assert config.max_batch_size == 4 and list(config.input[0].dims) == [4]
            as_json = (await c.get_model_config("affine", as_json=True))["config"]   # protobuf JSON: dims as strings
            assert as_json["input"][0]["dims"] == ["4"]
            await c.load_model("affine", config=json.dumps(as_json))   # read back, loaded again unchanged
            assert (await c.get_model_config("affine")).config == config
            with pytest.raises(InferenceServerException, match="failed to load 'affine'.*dynamic_batching"):
                await c.load_model("affine", config=json.dumps({"dynamic_batching": {}}))
            assert await c.is_model_ready("affine")
            await c.unload_model("echo")
            assert not await c.is_model_ready("echo")
            await c.load_model("echo")
            with pytest.raises(InferenceServerException, match="does not support Triton's trace extension"):
                await c.get_trace_settings()
            with pytest.raises(InferenceServerException, match="runners have no GPU"):
                await c.register_cuda_shared_memory("g", b"\0" * 64, 0, 64)
        finally:
            await c.close()
    asyncio.run(run())


def test_tcp_needs_the_token_once_one_is_set(short_tmp: Path) -> None:
    config = short_tmp / "config.toml"
    config.write_text('[server]\ntoken = "sesame-sesame-sesame"\n')
    d = DaemonProcess(short_tmp / "root", extra_args=["--config", str(config), "--grpc-listen", "127.0.0.1:0"]).start()
    ours = _private_dirs(d.proc.pid)   # grpcio's private directory
    assert len(ours) == 1
    try:
        c = tg.InferenceServerClient(d.grpc_host_port)
        assert c.is_server_live()                      # health is open, as /v2/health/ is
        with pytest.raises(InferenceServerException, match="needs server.token"):
            c.get_model_repository_index()
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED.*needs server.token"):
            c.get_trace_settings()                     # refused calls check the caller first too
        with pytest.raises(InferenceServerException, match="the token sent is not it"):
            c.get_model_repository_index(headers={"authorization": "Bearer wrong"})
        assert c.get_model_repository_index(headers={"authorization": "Bearer sesame-sesame-sesame"}) is not None
        c.close()
        unix = tg.InferenceServerClient(d.grpc_unix)   # the Unix socket asks for nothing
        assert unix.get_model_repository_index() is not None
        unix.close()
    finally:
        d.stop()
    assert not (d.root / "cartonstore.grpc.sock").exists()
    assert not [p for p in ours if p.exists()], "grpcio's private directory was left behind"


_OTHER_UID_CLIENT = """
import sys
import tritonclient.grpc as tg
c = tg.InferenceServerClient(sys.argv[1])
print(len(c.get_system_shared_memory_status().regions))
try:
    c.register_system_shared_memory("mine", sys.argv[2], 64)
    print("registered")
except Exception as e:
    print("refused:", e)
"""


@pytest.mark.slow
def test_another_uid_on_the_unix_socket_sees_and_takes_none_of_its_regions(short_tmp: Path) -> None:
    """The relay tells grpcio who each Unix-socket caller is: a second uid
    sees none of root's regions and may not register root's object."""
    import pwd
    import subprocess
    import sys

    from cartonstore.server.runner_processes.sandbox import unreachable

    try:
        other = pwd.getpwnam("cartonstore-runner")
    except KeyError:
        pytest.skip("no user cartonstore-runner to be the second uid (.ci/run creates it)")
    if os.getuid() != 0:
        pytest.skip("needs root to run a client as another uid")
    blocked = unreachable(os.path.realpath(sys.executable), other.pw_uid, other.pw_gid) or \
        unreachable(os.path.dirname(tg.__file__), other.pw_uid, other.pw_gid)
    if blocked:
        pytest.skip(f"the second uid cannot reach this Python: {blocked}")
    config = short_tmp / "config.toml"
    config.write_text('[server]\nsocket_mode = "0666"\n')
    os.chmod(short_tmp, 0o755)
    d = DaemonProcess(short_tmp / "root", extra_args=["--config", str(config)]).start()
    key = f"/cs-grpc-uid-{os.getpid()}"
    handle = shm.create_shared_memory_region("io", key, 64)
    try:
        os.chmod(d.root, 0o755)
        c = tg.InferenceServerClient(d.grpc_unix)
        c.register_system_shared_memory("io", key, 64)
        assert list(c.get_system_shared_memory_status().regions) == ["io"]
        out = subprocess.run([sys.executable, "-c", _OTHER_UID_CLIENT, d.grpc_unix, key], user=other.pw_uid,
                             group=other.pw_gid, capture_output=True, text=True, timeout=60, cwd="/")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == "0"
        assert lines[1].startswith("refused:") and f"belongs to uid 0, not your uid {other.pw_uid}" in lines[1]
        assert list(c.get_system_shared_memory_status().regions) == ["io"]
        c.close()
    finally:
        shm.destroy_shared_memory_region(handle)
        d.stop()


def test_a_caller_going_around_the_relay_is_refused(served: DaemonProcess) -> None:
    """grpcio's own socket is in a directory only the daemon's uid may
    enter; a caller that reaches it all the same (root) without the relay
    is refused."""
    import stat

    # this module's daemon's only: another test's daemon may be stopping, its socket gone between two reads
    mine = f"/cartonstore-grpc-{served.proc.pid}-"
    paths = {line.split()[-1] for line in Path("/proc/net/unix").read_text().splitlines()[1:]
             if mine in line.split()[-1] and line.split()[-1].endswith("/grpc.sock")}
    assert paths, f"no gRPC server socket of pid {served.proc.pid} found in /proc/net/unix"
    for path in paths:
        directory = os.stat(os.path.dirname(path))
        assert stat.S_IMODE(directory.st_mode) == 0o700 and directory.st_uid == os.getuid()
        c = tg.InferenceServerClient(f"unix://{path}")
        with pytest.raises(InferenceServerException, match="PERMISSION_DENIED.*daemon's gRPC socket only"):
            c.get_model_repository_index()
        c.close()
    # grpcio listens on no abstract name (anyone could connect to one); the relay's own names listen on nothing
    listening = [line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:]]
    assert not [f for f in listening if len(f) > 7 and f[-1].startswith("@") and "cartonstore-grpc" in f[-1]
                and int(f[3], 16) & 0x10000]   # __SO_ACCEPTCON: a listening socket


def test_a_killed_daemons_private_directory_is_swept_at_the_next_start(short_tmp: Path, monkeypatch) -> None:
    """The private directory is removed at stop; one a SIGKILLed daemon left
    is removed by the next daemon of that uid (its pid is in the name), one
    of a live process is not."""
    import subprocess
    import tempfile

    from cartonstore.server.rpc.unix_relay import private_directory

    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = short_tmp / f"cartonstore-grpc-{gone.pid}-abc"
    live = short_tmp / f"cartonstore-grpc-{os.getpid()}-def"
    for d in (dead, live):
        d.mkdir(mode=0o700)
        (d / "grpc.sock").write_bytes(b"")
    made = private_directory()
    assert not dead.exists() and live.exists()
    assert made.parent == short_tmp and oct(made.stat().st_mode & 0o777) == "0o700"


def test_a_streams_window_bounds_requests_and_bytes() -> None:
    """At most ``count`` requests and ``size`` bytes of a stream in flight;
    one request bigger than ``size`` runs, alone."""
    from cartonstore.server.rpc.servicer import _StreamWindow

    async def run() -> None:
        window = _StreamWindow(3, 100)
        await window.take(40)
        await window.take(40)
        third = asyncio.ensure_future(window.take(40))    # 120 bytes: over the size, it waits
        await asyncio.sleep(0.05)
        assert not third.done()
        await window.give(40)
        await asyncio.wait_for(third, 1)
        await window.take(10)                               # 90 bytes, 3 requests: full by count
        fourth = asyncio.ensure_future(window.take(1))
        await asyncio.sleep(0.05)
        assert not fourth.done()
        for size in (40, 40, 10):
            await window.give(size)
        await asyncio.wait_for(fourth, 1)
        await window.give(1)
        assert (window.requests, window.bytes) == (0, 0)
        await asyncio.wait_for(window.take(1000), 1)        # bigger than the window: alone, at once
        big_and_another = asyncio.ensure_future(window.take(1))
        await asyncio.sleep(0.05)
        assert not big_and_another.done()
        await window.give(1000)
        await asyncio.wait_for(big_and_another, 1)
    asyncio.run(run())


def test_uploads_and_named_regions_over_grpc(served: DaemonProcess) -> None:
    """A load's files as gRPC bytes parameters (tritonclient.grpc's files=),
    and the CUDA status of a region that is not there."""
    from conftest import FIXTURE_CARTON, FIXTURE_DIGEST

    c = tg.InferenceServerClient(served.grpc_unix)
    c.load_model("uploaded", config=json.dumps({"name": "uploaded"}),
                 files={"file:1/model.carton": FIXTURE_CARTON.read_bytes()})
    assert c.is_model_ready("uploaded", FIXTURE_DIGEST)
    with pytest.raises(InferenceServerException, match="failed to load 'junk'.*(carton|zip)"):
        c.load_model("junk", files={"file:1/model.carton": b"not a zip at all" * 100})
    with pytest.raises(InferenceServerException,
                       match="INVALID_ARGUMENT.*Unable to find cuda shared memory region: 'r'"):
        c.get_cuda_shared_memory_status("r")
    c.unload_model("uploaded")
    c.close()


def test_a_grpc_port_in_use_fails_the_start_naming_it(short_tmp: Path) -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        d = DaemonProcess(short_tmp / "root", extra_args=["--grpc-listen", f"127.0.0.1:{port}"])
        with pytest.raises(RuntimeError, match="daemon exited before ready") as raised:
            d.start()
    finally:
        taken.close()
    assert f"server.grpc_listen: cannot listen on 127.0.0.1:{port}" in str(raised.value)
    assert "Traceback" not in str(raised.value)


def _descriptors(pid: int) -> set[str]:
    """What each of the process's descriptors is open on (socket:[inode], a
    path): a descriptor closed meanwhile whose number is reused is not
    taken for the one it was."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:   # closed as it was listed
            pass
    return out


def test_relayed_connections_leave_no_descriptor_behind(served: DaemonProcess) -> None:
    """Each relayed connection holds three descriptors (the caller's socket
    and both ends of the link to grpcio); when its caller closes, grpcio
    closes its side and the relay drops all three (a link half-closed both
    ways was once kept for good)."""
    pid = served.proc.pid
    before = _descriptors(pid)
    for url in (served.grpc_unix, served.grpc_host_port):
        # a subchannel pool of its own each: a connection each, not one shared
        clients = [tg.InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
                   for _ in range(30)]
        for c in clients:
            assert c.is_server_live()
        assert len(_descriptors(pid) - before) >= 30 * 3   # three each, while they are open
        for c in clients:
            c.close()
    assert wait_for(lambda: len(_descriptors(pid) - before) <= 2, 10), _descriptors(pid) - before


def test_grpc_over_tls_on_tcp_is_relayed_to_grpcio_which_terminates_it(short_tmp: Path) -> None:
    """The TCP listener is the daemon's own (its connections counted, per
    address too); TLS passes through the relay to grpcio, and TcpAccess
    holds TCP callers to the token as before."""
    cert, key = make_cert(short_tmp / "tls")
    config = short_tmp / "config.toml"
    config.write_text(f'[server]\ntoken = "sesame-sesame-sesame"\ntls_cert = "{cert}"\ntls_key = "{key}"\n')
    d = DaemonProcess(short_tmp / "root", extra_args=["--config", str(config), "--grpc-listen", "127.0.0.1:0"]).start()
    try:
        assert f"grpcs://{d.grpc_host_port}" in d.status
        c = tg.InferenceServerClient(d.grpc_host_port, ssl=True, root_certificates=str(cert))
        assert c.is_server_live()
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED.*needs server.token"):
            c.get_model_repository_index()
        assert c.get_model_repository_index(headers={"authorization": "Bearer sesame-sesame-sesame"}) is not None
        c.close()
        plain = tg.InferenceServerClient(d.grpc_host_port)   # no TLS: grpcio's handshake refuses it
        with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
            plain.is_server_live(client_timeout=5)
        plain.close()
    finally:
        d.stop()
