"""The daemon<->runner contract of cartonstore.runner.protocol, held to by
a runner written against that page alone: the standard library's HTTP
server and protocol.py's names, none of the SDK. A real daemon starts it,
waits for it, sends it infers and stops it; the launcher that sandboxed
runners go through hands it its socket as the page says."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from conftest import short_dir
from kit.daemonkit import DaemonProcess, call, wait_for
from kit.inferkit import runner_pids, third_party_config
from kit.runnerkit import carton_toml

from cartonstore.runner.protocol import (
    DAEMON_IDLE_LIMIT,
    EXIT_LOAD_FAILED,
    LISTEN_FD,
    READY_PATH,
    RUNNER_IDLE_LIMIT,
    STANDARD_ARGV,
    parse_timing,
    timing_header,
)
from cartonstore.v2.statistics import RequestTiming

# Scales x by [runner.opts] scale; refuses to load when [runner.opts] refuse says why. It takes every
# infer in the binary form only, and tells the daemon where each request's time went (queue=3, input=5,
# infer=1000, output=7 ns), so the daemon's statistics show whether it read the timing header.
THIRD_PARTY_RUNNER = r'''
import argparse, array, json, os, signal, socket, socketserver, sys, threading
from http.server import BaseHTTPRequestHandler

from cartonstore.runner import protocol as p

sdk = sorted(m for m in sys.modules if m.startswith("cartonstore.runner.") and m != "cartonstore.runner.protocol")
if sdk:
    print(f"a third-party runner must not load the SDK, and loaded {sdk}", file=sys.stderr)
    sys.exit(p.EXIT_LOAD_FAILED)

parser = argparse.ArgumentParser()
for flag in p.STANDARD_ARGV[::2]:
    parser.add_argument(flag, required=True)
args = parser.parse_args()
opts = json.loads(args.opts)
if "refuse" in opts:
    print(f"cannot load: {opts['refuse']}", file=sys.stderr)
    sys.exit(p.EXIT_LOAD_FAILED)
scale = opts.get("scale", 1)

if os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS") == "1":
    listener, bound = socket.socket(fileno=p.LISTEN_FD), None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
else:
    listener, bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), args.socket
    umask = os.umask(0o177)
    listener.bind(bound)
    os.umask(umask)
    listener.listen(64)
print(f"listening on {'fd %d' % p.LISTEN_FD if bound is None else bound}", file=sys.stderr, flush=True)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = p.RUNNER_IDLE_LIMIT

    def log_message(self, *_):
        pass

    def reply(self, status, body=b"", headers=None):
        self.send_response(status)
        for name, value in (headers or {"Content-Type": "application/json"}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, message):
        self.reply(status, json.dumps({"error": message}).encode())

    def do_GET(self):
        if self.path == p.READY_PATH:
            self.reply(200)
        elif self.path == p.SERVER_METADATA_PATH:
            self.reply(200, json.dumps({"name": "third-party", "extensions": []}).encode())
        else:
            self.error(404, f"no route {self.path}")

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != p.infer_path(args.name):
            return self.error(404, f"no route {self.path}")
        if self.headers.get("Content-Type") != "application/octet-stream":
            return self.error(400, f"not the binary form: {self.headers.get('Content-Type')}")
        length = int(self.headers["Inference-Header-Content-Length"])
        (x,) = json.loads(body[:length])["inputs"]
        values = array.array("f", body[length:length + x["parameters"]["binary_data_size"]])
        y = array.array("f", (v * scale for v in values)).tobytes()
        header = json.dumps({"model_name": args.name, "model_version": args.version, "outputs": [
            {"name": "y", "datatype": "FP32", "shape": x["shape"], "parameters": {"binary_data_size": len(y)}}]})
        self.reply(200, header.encode() + y, {"Content-Type": "application/octet-stream",
                                              "Inference-Header-Content-Length": str(len(header)),
                                              p.TIMING_HEADER: "queue=3;input=5;infer=1000;output=7"})


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


server = Server(args.socket, Handler, bind_and_activate=False)
server.socket.close()
server.socket = listener
signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
server.serve_forever()
server.server_close()
if bound is not None:
    os.unlink(bound)
'''

DECLARED = {"inputs": [("x", "float32", ["batch", "n"])], "outputs": [("y", "float32", ["batch", "n"])]}


def test_the_daemon_lets_go_of_an_idle_connection_before_the_runner_does() -> None:
    """The other order loses a request: the runner closing a connection the
    daemon has just picked from its pool and written to."""
    assert DAEMON_IDLE_LIMIT < RUNNER_IDLE_LIMIT


def test_a_timing_header_round_trips() -> None:
    timing = RequestTiming(1, 22, 333, 4444)
    assert parse_timing(timing_header(timing)) == timing
    assert parse_timing(f"  {timing_header(timing)}\t") == timing


@pytest.mark.parametrize("text", [
    None, "", "queue=1;input=2;infer=3", "queue=1;input=2;infer=3;output=x", "queue=-1;input=2;infer=3;output=4",
    "queue=1;input=2;infer=3;output=4;more=5", "queue=12345678901234567890;input=2;infer=3;output=4",
    "output=4;infer=3;input=2;queue=1"])
def test_a_malformed_timing_header_is_not_believed(text: str | None) -> None:
    assert parse_timing(text) is None


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[DaemonProcess, Path]]:
    with short_dir() as base:
        config = third_party_config(base, "plain", THIRD_PARTY_RUNNER, STANDARD_ARGV)
        for name, opts in (("scaled", {"scale": 3}), ("refusing", {"refuse": "no such accelerator here"})):
            (base / name).mkdir()
            (base / name / "carton.toml").write_text(carton_toml("plain", ">=1", opts, model_name=name, **DECLARED))
        d = DaemonProcess(base / "root", extra_args=["--config", str(config)]).start()
        try:
            yield d, base
        finally:
            d.stop()
        assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)


def _load(d: DaemonProcess, base: Path, name: str) -> tuple[int, object]:
    return call(d, "POST", f"/v2/repository/models/{name}/load", json={"parameters": {"source": str(base / name)}})


def test_a_third_party_runner_answers_infers_through_the_daemon(served) -> None:
    """Started with the standard argv and its opts, ready by READY_PATH,
    sent every infer in the binary form (JSON data converted, a big tensor
    over its socket since it maps no arena), its timing header counted in
    the model's statistics; stopped by SIGTERM on unload."""
    d, base = served
    status, body = _load(d, base, "scaled")
    assert status == 200, body
    client = triton.InferenceServerClient(d.host_port, network_timeout=60)
    try:
        cases = [(np.arange(6, dtype=np.float32).reshape(2, 3), True), (np.ones((1, 4), np.float32), False),
                 (np.full((1, 1 << 17), 0.5, np.float32), True)]   # 512 KiB: past the arena's threshold
        for x, binary in cases:
            tensor = triton.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            np.testing.assert_array_equal(client.infer("scaled", [tensor]).as_numpy("y"), x * 3)
    finally:
        client.close()
    stats = call(d, "GET", "/v2/models/scaled/stats")[1]["model_stats"][0]["inference_stats"]
    assert stats["success"]["count"] == len(cases)
    assert stats["queue"]["ns"] == 3 * len(cases)
    assert stats["compute_infer"]["ns"] == 1000 * len(cases)
    pids = runner_pids(d.root)
    assert pids
    assert call(d, "POST", "/v2/repository/models/scaled/unload", json={})[0] == 200
    assert wait_for(lambda: not set(pids) & set(runner_pids(d.root)), 10)


def test_a_runner_that_cannot_load_exits_with_the_load_failed_status(served) -> None:
    d, base = served
    status, body = _load(d, base, "refusing")
    assert status == 400, body
    assert f"exited with status {EXIT_LOAD_FAILED}" in body["error"], body
    assert "cannot load: no such accelerator here" in body["error"], body


def test_the_launcher_hands_the_listening_socket_as_protocol_says(tmp_path: Path) -> None:
    """A sandboxed runner cannot bind its socket: the launcher every
    sandboxed runner goes through passes it as LISTEN_FD with LISTEN_FDS
    and LISTEN_PID, and the third-party runner serves on it, not on the
    path its --socket names."""
    with short_dir() as base:
        script = base / "plain.py"
        script.write_text(THIRD_PARTY_RUNNER)
        path = str(base / "r.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(8)
        argv = [sys.executable, "-m", "cartonstore.system.confine", json.dumps({"listen_fd": listener.fileno()}),
                "--", sys.executable, str(script), "--model-dir", str(tmp_path), "--socket", str(base / "other.sock"),
                "--name", "m", "--version", "1", "--opts", "{}", "--devices", "cpu"]
        proc = subprocess.Popen(argv, pass_fds=(listener.fileno(),), stderr=subprocess.PIPE, text=True)
        listener.close()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(30)
                conn.connect(path)
                conn.sendall(f"GET {READY_PATH} HTTP/1.1\r\nHost: runner\r\n\r\n".encode())
                assert conn.recv(4096).startswith(b"HTTP/1.1 200 "), proc.stderr
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert f"listening on fd {LISTEN_FD}" in err
