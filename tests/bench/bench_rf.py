#!/usr/bin/env python3
"""Benchmark: one-row inference of a small model through the daemon,
against a bare in-process v2 server, with the same client, in the same run.

    python tests/bench/bench_rf.py [--requests 2000] [--rounds 2]

The model: a scikit-learn RandomForest (50 trees) on 4 features, converted
by skl2onnx with zipmap off (label int64, probabilities float32). The
client: tritonclient.http, one connection, sequential requests of one row,
binary outputs.

- Baseline: a bare v2 server in a process of its own: uvloop, aiohttp,
  onnxruntime's session called in the handler, the request and answer
  framed by cartonstore.v2 (the binary tensor data extension).
- Bare, split in two: the least any server that runs models in a process
  of their own can do (the floor of a sandboxed design). The same uvloop +
  aiohttp front forwards the body as it came to a second process over a
  Unix socket (with the daemon's own runner client, wire.py), where a
  thread per connection (blocking sockets, no event loop) decodes it,
  calls onnxruntime and writes the answer. No validation, no statistics.
- Ours: cartonstore serve on loopback TCP, the model packed from the same
  .onnx file (cartonstore pack) and loaded; requests go through the daemon
  to its runner process.
- The split front with our runner: the split server's front forwarding to
  a second runner process of the loaded model (the runner SDK, the same
  command the daemon runs, unsandboxed), which parts what ours adds past
  the split floor into the runner's share and the daemon's.
- KServe (``--kserve PYTHON``, a python with kserve installed): KServe's
  ``ModelServer`` on its REST port, a ``kserve.Model`` whose predict calls
  onnxruntime in-process (the v2 protocol, binary tensor data included).

Printed: p50 and p99 of each (all rounds' samples pooled), the p50 ratios
against the bare server and against the split one, and where a request's
time went in the daemon (its statistics: the
runner's queue, decode, model and encode times from its timing header; the
rest is the hop between daemon and runner). Target (issue 29): ours <=
1.3x the bare server.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE.parent))

from kit.daemonkit import DaemonProcess, call

# Both fronts' app: the handler `infer` on the infer route, served on uvloop at the port argv[2] names.
APP = r'''
async def ready(request):
    return web.Response()

app = web.Application()
app.router.add_post("/v2/models/rf/infer", infer)
app.router.add_get("/v2/health/ready", ready)
uvloop.install()
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=lambda *a: print("ready", flush=True),
            access_log=None)
'''

BARE = r'''
import asyncio, sys
import numpy as np, onnxruntime as ort, uvloop
from aiohttp import web
from cartonstore.v2.encode import encode_infer_response
from cartonstore.v2.framing import parse_infer_request, tensor_to_numpy

options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(sys.argv[1], sess_options=options, providers=["CPUExecutionProvider"])
names = [o.name for o in session.get_outputs()]

async def infer(request):
    body = await request.read()
    length = request.headers.get("Inference-Header-Content-Length")
    req = parse_infer_request(body, int(length) if length is not None else None)
    feed = {t.name: tensor_to_numpy(t) for t in req.inputs}
    outputs = dict(zip(names, session.run(names, feed)))
    parts, header = encode_infer_response(model_name="rf", model_version="1", request_id=req.id,
                                          outputs=outputs, binary=req.wants_binary)
    headers = {"Inference-Header-Content-Length": str(header)} if header is not None else {}
    return web.Response(body=b"".join(parts), headers=headers,
                        content_type="application/octet-stream" if header is not None else "application/json")
''' + APP

# The split server's front: the bare server's, forwarding what it got.
SPLIT_FRONT = r'''
import sys, uvloop
from aiohttp import web
from cartonstore.server.runner_processes.wire import RunnerClient

client = RunnerClient(sys.argv[1])

async def infer(request):
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k in ("Content-Type", "Inference-Header-Content-Length")}
    status, answer_headers, answer = await client.request("POST", request.path, headers, [body], limit=1 << 30)
    keep = {k: v for k, v in answer_headers.items() if k in ("content-type", "inference-header-content-length")}
    return web.Response(status=status, body=answer, headers=keep)
''' + APP

# The split server's model process: a thread per connection, the model called in it.
SPLIT_MODEL = r'''
import os, socket, sys, threading
import onnxruntime as ort
from cartonstore.v2.encode import encode_infer_response
from cartonstore.v2.framing import parse_infer_request, tensor_to_numpy

options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(sys.argv[1], sess_options=options, providers=["CPUExecutionProvider"])
names = [o.name for o in session.get_outputs()]

def serve(conn):
    pending = bytearray()
    while True:
        while (end := pending.find(b"\r\n\r\n")) < 0:
            data = conn.recv(65536)
            if not data:
                return conn.close()
            pending += data
        lines = pending[:end].decode("latin-1").split("\r\n")
        del pending[:end + 4]
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        size = int(headers["content-length"])
        while len(pending) < size:
            pending += conn.recv(65536)
        body = bytes(pending[:size])
        del pending[:size]
        length = headers.get("inference-header-content-length")
        req = parse_infer_request(body, int(length) if length is not None else None)
        outputs = dict(zip(names, session.run(names, {t.name: tensor_to_numpy(t) for t in req.inputs})))
        parts, header = encode_infer_response(model_name="rf", model_version="1", request_id=req.id,
                                              outputs=outputs, binary=req.wants_binary)
        kind = "application/octet-stream" if header is not None else "application/json"
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {sum(len(p) for p in parts)}\r\n"
                + (f"Inference-Header-Content-Length: {header}\r\n" if header is not None else "") + "\r\n")
        conn.sendmsg([head.encode(), *parts])

listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[2])
listener.listen(64)
print("ready", flush=True)
while True:
    threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()
'''


def forest(path: Path) -> None:
    from skl2onnx import to_onnx
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(np.int64) + (x[:, 3] > 1)
    model = RandomForestClassifier(n_estimators=50, max_depth=8, random_state=0).fit(x, y)
    onx = to_onnx(model, x[:1], options={id(model): {"zipmap": False}}, target_opset=15)
    path.write_bytes(onx.SerializeToString())


def latencies(host_port: str, model: str, requests: int) -> list[float]:
    import tritonclient.http as triton

    c = triton.InferenceServerClient(host_port)
    x = triton.InferInput("X", [1, 4], "FP32")
    x.set_data_from_numpy(np.array([[0.1, -0.2, 0.3, 1.5]], np.float32))
    outputs = [triton.InferRequestedOutput("label"), triton.InferRequestedOutput("probabilities")]
    for _ in range(50):
        c.infer(model, [x], outputs=outputs)
    out = []
    for _ in range(requests):
        start = time.perf_counter()
        c.infer(model, [x], outputs=outputs)
        out.append(time.perf_counter() - start)
    c.close()
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def started(argv: list[str], cwd: Path) -> subprocess.Popen:
    """A server process, once it printed "ready"."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=str(cwd))
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        raise RuntimeError(f"{argv[:3]} did not start: {line!r}")
    return proc


def our_runner(d: DaemonProcess, socket_path: Path) -> subprocess.Popen:
    """A second runner of the loaded model "rf", unsandboxed, as the
    daemon runs its first one, on a socket of its own, once it listens."""
    model_dir = subprocess.run([sys.executable, "-m", "cartonstore.cli", "path", "rf", "--root", str(d.root)],
                               check=True, capture_output=True, text=True).stdout.strip()
    argv = [sys.executable, "-m", "cartonstore.runner.backends.onnx", "--model-dir", model_dir, "--socket", str(socket_path),
            "--name", "rf", "--version", Path(model_dir).name, "--opts", json.dumps({"intra_op_num_threads": 1}),
            "--devices", "cpu"]
    log = socket_path.with_suffix(".log")
    with open(log, "w") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 60
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"our runner did not start: {argv}\n{log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kserve", metavar="PYTHON", help="a python with kserve (and onnxruntime) installed")
    args = ap.parse_args()
    repo = HERE.parents[1]
    with tempfile.TemporaryDirectory(prefix="cs-rf-", dir="/tmp") as tmp:
        work = Path(tmp)
        work.chmod(0o755)   # a sandboxed runner's user reads the store under it
        onnx_file = work / "rf.onnx"
        forest(onnx_file)
        carton = work / "rf.carton"
        subprocess.run([sys.executable, "-m", "cartonstore.cli", "pack", str(onnx_file), "-o", str(carton),
                        "--name", "rf"], check=True, stdout=subprocess.DEVNULL)
        servers: list[subprocess.Popen] = []
        where: dict[str, str] = {}
        d = DaemonProcess(work / "root").start()
        try:
            port = free_port()
            servers.append(started([sys.executable, "-c", BARE, str(onnx_file), str(port)], repo))
            where["bare"] = f"127.0.0.1:{port}"
            port, model_socket = free_port(), str(work / "model.sock")
            servers.append(started([sys.executable, "-c", SPLIT_MODEL, str(onnx_file), model_socket], repo))
            servers.append(started([sys.executable, "-c", SPLIT_FRONT, model_socket, str(port)], repo))
            where["split"] = f"127.0.0.1:{port}"
            if args.kserve:
                port = free_port()
                servers.append(started([args.kserve, str(HERE / "kserve_rf.py"), str(onnx_file), str(port)], repo))
                where["kserve"] = f"127.0.0.1:{port}"
            status, body = call(d, "POST", "/v2/repository/models/rf/load",
                                json={"parameters": {"source": str(carton),
                                                     "config": json.dumps({"parameters": {
                                                         "intra_op_num_threads": {"string_value": "1"}}})}})
            assert status == 200, body
            port, runner_socket = free_port(), work / "runner.sock"
            servers.append(our_runner(d, runner_socket))
            servers.append(started([sys.executable, "-c", SPLIT_FRONT, str(runner_socket), str(port)], repo))
            where["front+runner"] = f"127.0.0.1:{port}"
            where["ours"] = d.host_port
            samples: dict[str, list[float]] = {name: [] for name in where}
            for r in range(args.rounds):
                order = list(where.items())
                for name, host_port in (order if r % 2 == 0 else order[::-1]):
                    samples[name] += latencies(host_port, "rf", args.requests)
            status, stats = call(d, "GET", "/v2/models/rf/stats")
        finally:
            d.stop()
            for server in servers:
                server.terminate()
                server.wait()
    p = {name: np.percentile(v, [50, 99]) * 1e3 for name, v in samples.items()}
    print(f"RandomForest (50 trees, 4 features), one row, tritonclient.http, {args.requests} x {args.rounds} "
          f"sequential requests each:")
    labels = {"bare": "bare uvloop + aiohttp + onnxruntime",
              "split": "the same, split in two processes",
              "kserve": "KServe ModelServer + onnxruntime",
              "front+runner": "the split front + our runner",
              "ours": "cartonstore daemon + runner"}
    for name in where:
        print(f"  {labels[name]:<38} p50 {p[name][0]:.3f} ms   p99 {p[name][1]:.3f} ms")
    # where a request's time went, as the daemon's statistics (Triton's) count it, mean per request
    phases = stats["model_stats"][0]["inference_stats"]
    mean = {k: phases[k]["ns"] / max(1, phases[k]["count"]) / 1e3 for k in
            ("success", "queue", "compute_input", "compute_infer", "compute_output")}
    print(f"  in the daemon, mean per request (us): all {mean['success']:.0f} = queue {mean['queue']:.0f} "
          f"(waiting for a model thread) + input {mean['compute_input']:.0f} (the daemon's checks and the runner's "
          f"decoding) + infer {mean['compute_infer']:.0f} (onnxruntime) + output {mean['compute_output']:.0f} "
          f"(encoding) + the rest (the runner's HTTP hop, both ways): "
          f"{mean['success'] - mean['queue'] - mean['compute_input'] - mean['compute_infer'] - mean['compute_output']:.0f}")
    ratio = p["ours"][0] / p["bare"][0]
    print(f"p50 ours / bare: {ratio:.2f}  (target <= 1.3)  {'PASS' if ratio <= 1.3 else 'FAIL'}")
    print(f"p50 split / bare: {p['split'][0] / p['bare'][0]:.2f}  (the floor of a model in a process of its own)")
    print(f"p50 ours / split: {p['ours'][0] / p['split'][0]:.2f}  (what ours adds past that floor)")
    print(f"  of which the runner SDK's (front+runner - split): {(p['front+runner'][0] - p['split'][0]) * 1e3:.0f} us, "
          f"the daemon's (ours - front+runner): {(p['ours'][0] - p['front+runner'][0]) * 1e3:.0f} us")
    if "kserve" in p:
        ratio = p["ours"][0] / p["kserve"][0]
        print(f"p50 ours / KServe: {ratio:.2f}  (target <= 1.0)  {'PASS' if ratio <= 1.0 else 'FAIL'}")


if __name__ == "__main__":
    main()
