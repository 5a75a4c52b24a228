"""TCP callers authenticate: with server.token configured every route but
/v2/health/* needs it (the aiohttp routes and the routes the daemon's own
front answers alike), the peer token opens /v1/blobs and nothing else, and
the Unix socket asks for nothing; gRPC over TCP is refused from a call's
headers, its message unread. A listener beyond loopback with no credential
does not start. Real daemons, stock tritonclient, raw HTTP and gRPC."""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from kit.daemonkit import DaemonProcess, call
from kit.inferkit import echo_carton
from tritonclient.utils import InferenceServerException

from cartonstore.errors import PermissionDenied, Unauthenticated
from cartonstore.server.calls.access import TcpAccess
from cartonstore.server.daemon import DaemonSettings

API = "api-s3cret"
PEER = "peer-s3cret"
BEARER = {"Authorization": f"Bearer {API}"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory) -> Iterator[DaemonProcess]:
    """A daemon whose TCP listeners (HTTP and gRPC) want server.token (from
    a file), with the echo carton loaded over the Unix socket (which asks
    for nothing)."""
    from conftest import short_dir

    with short_dir() as base:
        token_file = base / "api-token"
        token_file.write_text(API + "\n")
        token_file.chmod(0o600)
        config = base / "cartonstore.toml"
        config.write_text(f'[server]\ntoken_file = "{token_file}"\n[peers]\ntoken = "{PEER}"\n')
        source = echo_carton(base / "echo", dtypes=["float32"])
        with DaemonProcess(base / "root", extra_args=["--config", str(config), "--grpc-listen", "127.0.0.1:0"]) as d:
            status, body = call(d, "POST", "/v2/repository/models/echo/load",
                                json={"parameters": {"source": str(source)}})
            assert status == 200, body
            yield d


def raw(d: DaemonProcess, method: str, path: str, body: bytes = b"",
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    host, port = d.host_port.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def infer_body() -> tuple[bytes, dict[str, str]]:
    doc = {"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}
    return json.dumps(doc).encode(), {"Content-Type": "application/json"}


def test_health_is_open_and_everything_else_needs_the_token(guarded: DaemonProcess) -> None:
    assert raw(guarded, "GET", "/v2/health/live")[0] == 200
    assert raw(guarded, "GET", "/v2/health/ready")[0] == 200
    body, headers = infer_body()
    for method, path, data in (("GET", "/v2", b""), ("GET", "/metrics", b""), ("GET", "/v2/models/echo", b""),
                               ("POST", "/v2/repository/index", b"{}"),
                               ("POST", "/v2/models/echo/infer", body),                    # the front answers it
                               ("POST", "/v1/leases", b'{"model": "echo", "ttl": 5}')):   # the front too
        status, got_headers, answer = raw(guarded, method, path, data, headers)
        assert status == 401, (path, status, answer)
        assert "server.token" in json.loads(answer)["error"]
        assert got_headers["WWW-Authenticate"] == 'Bearer realm="cartonstore"'
        status, _, answer = raw(guarded, method, path, data, {**headers, **BEARER})
        assert status == 200, (path, answer)


def test_a_wrong_token_and_another_scheme_are_refused(guarded: DaemonProcess) -> None:
    for sent in ("Bearer wrong", f"Basic {API}", f"Bearer {API}x", f"bearer {API}"):
        status, _, answer = raw(guarded, "GET", "/v2", headers={"Authorization": sent})
        assert status == 401 and "the token sent is not it" in json.loads(answer)["error"], sent


def test_the_peer_token_opens_blobs_and_nothing_else(guarded: DaemonProcess) -> None:
    peer = {"Authorization": f"Bearer {PEER}"}
    status, _, answer = raw(guarded, "POST", "/v2/repository/models/other/load", b"{}", peer)
    assert status == 403 and "authorizes /v1/blobs only" in json.loads(answer)["error"]
    body, headers = infer_body()
    assert raw(guarded, "POST", "/v2/models/echo/infer", body, {**headers, **peer})[0] == 403
    main = (guarded.root / "models")
    model_dir = next(main.iterdir())
    blob = (model_dir / "carton.toml").read_bytes()
    path = f"/v1/blobs/{hashlib.sha256(blob).hexdigest()}"
    assert raw(guarded, "GET", path)[0] == 401
    status, _, got = raw(guarded, "GET", path, headers=peer)
    assert status == 200 and got == blob
    assert raw(guarded, "GET", path, headers=BEARER)[0] == 200   # server.token covers every route


def test_stock_tritonclient_passes_the_token_with_headers(guarded: DaemonProcess) -> None:
    client = triton.InferenceServerClient(guarded.host_port)
    assert client.is_server_live()   # /v2/health/live: no credential
    with pytest.raises(InferenceServerException, match="server.token"):
        client.get_model_metadata("echo")
    with pytest.raises(InferenceServerException, match="authorizes /v1/blobs only"):
        client.load_model("echo", headers={"Authorization": f"Bearer {PEER}"})
    assert client.is_model_ready("echo", headers=BEARER)
    x = triton.InferInput("x_float32", [2, 3], "FP32")
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    x.set_data_from_numpy(data, binary_data=True)
    with pytest.raises(InferenceServerException, match="server.token"):
        client.infer("echo", [x])
    result = client.infer("echo", [x], headers=BEARER)
    assert np.array_equal(result.as_numpy("y_float32"), data)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_grpc_without_the_token_is_refused_before_its_message_is_read(guarded: DaemonProcess) -> None:
    """grpcio reads a unary call's whole message before its method runs: a
    credential checked there let 8 tokenless callers sending 100 MiB each
    take the daemon from 78 to 1,340 MiB. Checked from the call's headers,
    their messages are never read; a caller with the token still infers."""
    pid = guarded.proc.pid
    big = triton_grpc.service_pb2.ModelInferRequest(model_name="echo", raw_input_contents=[bytes(100 << 20)])
    options = [("grpc.max_send_message_length", -1), ("grpc.use_local_subchannel_pool", 1)]   # a connection each

    def tokenless(_: int) -> str:
        with grpc.insecure_channel(guarded.grpc_host_port, options=options) as channel:
            try:
                call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                           request_serializer=triton_grpc.service_pb2.ModelInferRequest.SerializeToString)
                call(big, timeout=60)
            except grpc.RpcError as e:
                return f"{e.code().name}: {e.details()}"
        return "answered"

    before = peak = rss(pid)
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, rss(pid))
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = set(pool.map(tokenless, range(8)))
    finally:
        done.set()
        watcher.join()
    print(f"daemon RSS: {before >> 20} MiB before, {peak >> 20} MiB at most while 8 tokenless callers sent 100 MiB each")
    refusal = "UNAUTHENTICATED: /inference.GRPCInferenceService/ModelInfer over TCP needs server.token as a Bearer token"
    assert answers == {refusal}, answers
    assert peak - before < 32 << 20
    client = triton_grpc.InferenceServerClient(guarded.grpc_host_port)
    try:
        assert client.is_server_live()   # ServerLive: no credential, as /v2/health/live
        x = triton_grpc.InferInput("x_float32", [1, 1 << 21], "FP32")   # 8 MiB: past the TCP window, as it is read
        data = np.arange(1 << 21, dtype=np.float32).reshape(1, -1)
        x.set_data_from_numpy(data)
        started = time.monotonic()
        result = client.infer("echo", [x], headers={"authorization": f"Bearer {API}"})
        print(f"an 8 MiB infer with the token over TCP: {(time.monotonic() - started) * 1000:.0f} ms")
        assert np.array_equal(result.as_numpy("y_float32"), data)
    finally:
        client.close()


def test_the_unix_socket_asks_for_nothing(guarded: DaemonProcess) -> None:
    status, body = call(guarded, "GET", "/v2/models/echo")
    assert status == 200 and body["name"] == "echo"
    assert call(guarded, "POST", "/v1/leases", json={"model": "echo", "ttl": 5})[0] == 200


def test_a_daemon_beyond_loopback_without_a_credential_does_not_start(tmp_path: Path) -> None:
    config = tmp_path / "cartonstore.toml"
    config.write_text('[server]\nallow_remote_listen = true\n')
    p = subprocess.run([sys.executable, "-m", "cartonstore.cli", "serve", "--root", str(tmp_path / "root"),
                        "--socket", str(tmp_path / "s.sock"), "--config", str(config), "--listen", "0.0.0.0:0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 4, p.stderr
    assert "no credential is configured" in p.stderr and "server.token" in p.stderr
    assert not (tmp_path / "s.sock").exists()
    # The library refuses too, for a caller that builds its settings itself.
    with pytest.raises(Exception, match="no credential is configured"):
        DaemonSettings(root=tmp_path / "root", socket=tmp_path / "s.sock", listen="0.0.0.0:0").tcp_access()
    assert DaemonSettings(root=tmp_path, socket=tmp_path / "s", listen="0.0.0.0:0", token="t").tcp_access().token == "t"
    assert not DaemonSettings(root=tmp_path, socket=tmp_path / "s", listen="127.0.0.1:0").tcp_access().has_credential


@pytest.mark.parametrize(("access", "path", "sent", "cert", "outcome"), [
    (TcpAccess(), "/v2/repository/models/m/load", None, False, None),                      # loopback quick start
    (TcpAccess(token="t"), "/v2/health/ready", None, False, None),
    (TcpAccess(token="t"), "/v2/models/m/infer", "Bearer t", False, None),
    (TcpAccess(token="t"), "/v2/models/m/infer", None, False, Unauthenticated),
    (TcpAccess(token="t", peer_token="p"), "/v2/models/m/infer", "Bearer p", False, PermissionDenied),
    (TcpAccess(token="t", peer_token="p"), "/v1/blobs/ab", "Bearer p", False, None),
    (TcpAccess(token="t", peer_token="p"), "/v1/blobs/ab", "Bearer t", False, None),
    (TcpAccess(peer_token="p"), "/v1/blobs/ab", None, False, Unauthenticated),
    (TcpAccess(peer_token="p"), "/v2/repository/index", None, False, None),                # no server credential
    (TcpAccess(client_ca=True), "/v2/repository/index", None, True, PermissionDenied),   # a peer's certificate
    (TcpAccess(client_ca=True), "/v1/blobs/ab", None, True, None),
    (TcpAccess(client_ca=True, token="t"), "/v2/repository/index", "Bearer t", True, None),
    (TcpAccess(client_ca=True), "/v2/repository/index", None, False, Unauthenticated),
    (TcpAccess(token="t"), "/v2/models/m/infer", "Bearer \udcff\udcfe", False, Unauthenticated),   # undecodable
    (TcpAccess(client_ca=True), "/v1/blobs/ab", None, False, PermissionDenied),
    (TcpAccess(client_ca=True, token="t"), "/v1/blobs/ab", "Bearer t", False, PermissionDenied),
])
def test_who_may_call_what(access: TcpAccess, path: str, sent: str | None, cert: bool, outcome: type | None) -> None:
    if outcome is None:
        access.check(path, sent, cert)
    else:
        with pytest.raises(outcome) as caught:
            access.check(path, sent, cert)
        assert type(caught.value) is outcome


def test_a_public_tcp_socket_from_systemd_without_a_credential_is_refused(tmp_path: Path) -> None:
    """Socket activation hands the daemon its sockets, settings aside: one
    beyond loopback is held to the same rule as server.listen."""
    listener = socket.create_server(("0.0.0.0", 0))
    fd = listener.fileno()
    launcher = ("import os, sys\n"
                "fd = int(sys.argv[1])\n"
                "if fd != 3:\n    os.dup2(fd, 3)\n    os.close(fd)\n"
                "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1')\n"
                "os.execv(sys.executable, [sys.executable, '-m', 'cartonstore.cli', 'serve', '--root', sys.argv[2]])\n")
    try:
        p = subprocess.run([sys.executable, "-c", launcher, str(fd), str(tmp_path / "root")], pass_fds=(fd,),
                           capture_output=True, text=True, timeout=60)
    finally:
        listener.close()
    assert p.returncode == 4, p.stderr
    assert "0.0.0.0 is not loopback and no credential is configured" in p.stderr
