#!/usr/bin/env python3
"""Benchmark: dynamic batching in the daemon, against the same model
without it, in the same run.

    python tests/bench/bench_batching.py [--clients 64] [--seconds 5] [--delay-us 2000] [--max-batch 64]
                                         [--hidden 2048] [--sandbox auto]

An ONNX MLP (float32 x [batch, 256] -> --hidden -> --hidden -> 16, ReLU
between; 2048: 18 MiB of weights, which one row's execution reads whole)
is built here and loaded twice into one daemon: "plain" with max_batch_size
alone, "batched" with dynamic_batching {max_queue_delay_microseconds:
--delay-us}. --clients concurrent clients (asyncio, aiohttp, one kept-alive
TCP connection each, binary v2 requests of one row) send back to back for
--seconds against each in turn; the same clients, the same requests.

Printed: requests per second, p50 and p99 latency of each, the ratio of
throughputs, and one batch's compute (onnxruntime in this process running
the model on --max-batch rows, median of 50), for the targets: batched
throughput >= 3x plain; batched p99 <= max_queue_delay + 2x one batch's
compute. Back to back, 64 clients keep the daemon saturated, so their
latency is 64 / throughput whatever the batching (Little's law); the p99
is also measured paced, the same clients sending on a fixed schedule at
half the batched throughput, and so is its floor: the same paced clients
against a bare uvloop + aiohttp server that answers at once, no model (what
the load generator and the machine's scheduling add by themselves).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
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
from kit.runnerkit import carton_toml

from cartonstore.v2.encode import encode_infer_request

WIDTH, OUT = 256, 16

# The paced p99's floor: answers every POST at once with 16 floats, no model.
INSTANT = r'''
import sys, uvloop
from aiohttp import web
body = bytes(64)

async def answer(request):
    await request.read()
    return web.Response(body=body, content_type="application/octet-stream")

app = web.Application()
app.router.add_post("/{tail:.*}", answer)
uvloop.install()
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=lambda *a: print("ready", flush=True),
            access_log=None)
'''


def mlp_carton(dest: Path, hidden: int) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(shape, dtype=np.float32) * 0.05
               for shape in ((WIDTH, hidden), (hidden, hidden), (hidden, OUT))]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"]), helper.make_node("Relu", ["h0"], ["a0"]),
             helper.make_node("MatMul", ["a0", "w1"], ["h1"]), helper.make_node("Relu", ["h1"], ["a1"]),
             helper.make_node("MatMul", ["a1", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", OUT])],
                              [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (dest / "model").mkdir(parents=True)
    (dest / "model" / "model.onnx").write_bytes(model.SerializeToString())
    (dest / "carton.toml").write_text(carton_toml("onnx", ">=1.10", None, model_name="mlp",
                                                  inputs=[("x", "float32", ["batch", WIDTH])],
                                                  outputs=[("y", "float32", ["batch", OUT])]))
    return dest


def batch_compute_seconds(carton: Path, rows: int) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(carton / "model" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((rows, WIDTH), dtype=np.float32)
    for _ in range(5):
        session.run(None, {"x": x})
    times = []
    for _ in range(50):
        start = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def drive(host_port: str, model: str, clients: int, seconds: float,
                rate: float | None = None) -> tuple[float, list[float]]:
    """(requests per second, latencies): back to back, or with ``rate``
    requests per second in all, each client on a fixed schedule (a latency
    counts from when its request was due, so a late send is not hidden)."""
    import aiohttp

    x = np.random.default_rng(2).standard_normal((1, WIDTH), dtype=np.float32)
    parts, length = encode_infer_request({"x": x})
    body = b"".join(bytes(p) for p in parts)
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(length)}
    url = f"http://{host_port}/v2/models/{model}/infer"
    latencies: list[float] = []
    deadline = time.monotonic() + 1.0   # a second of warming up, two clients

    async def client(session: aiohttp.ClientSession, index: int = 0) -> None:
        interval = clients / rate if rate else 0.0
        due = time.perf_counter() + interval * index / clients
        while time.monotonic() < deadline:
            if rate:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
            start = due if rate else time.perf_counter()
            async with session.post(url, data=body, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{model}: {r.status} {await r.text()}")
            latencies.append(time.perf_counter() - start)
            due += interval

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(2)))   # warm
        latencies.clear()
        deadline = time.monotonic() + seconds
        start = time.monotonic()
        await asyncio.gather(*(client(session, i) for i in range(clients)))
        took = time.monotonic() - start
    return len(latencies) / took, latencies


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--delay-us", type=int, default=2000)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=2048, help="the MLP's hidden width (its weights: 4 x (256 + "
                    "hidden + 16) x hidden bytes, read once per execution)")
    ap.add_argument("--sandbox", choices=["auto", "bwrap", "landlock", "none"], default="auto",
                    help="runners.sandbox for the daemon (a machine without bwrap or Landlock: none)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cs-batch-", dir="/tmp") as tmp:
        Path(tmp).chmod(0o755)   # the sandboxed runners' user reads the store under it
        carton = mlp_carton(Path(tmp) / "mlp", args.hidden)
        compute = batch_compute_seconds(carton, args.max_batch)
        config_file = Path(tmp) / "cartonstore.toml"
        config_file.write_text(f'[runners]\nsandbox = "{args.sandbox}"\n')
        d = DaemonProcess(Path(tmp) / "root", extra_args=["--config", str(config_file)]).start()
        try:
            configs = {"plain": {"max_batch_size": args.max_batch},
                       "batched": {"max_batch_size": args.max_batch,
                                   "dynamic_batching": {"max_queue_delay_microseconds": args.delay_us}}}
            for name, config in configs.items():
                status, body = call(d, "POST", f"/v2/repository/models/{name}/load",
                                    json={"parameters": {"source": str(carton), "config": json.dumps(config)}})
                assert status == 200, body
            results = {name: asyncio.run(drive(d.host_port, name, args.clients, args.seconds)) for name in configs}
            # latency under a load the daemon carries: half what it carried back to back
            paced_rate = results["batched"][0] * 0.5
            paced = asyncio.run(drive(d.host_port, "batched", args.clients, args.seconds, paced_rate))
            status, stats = call(d, "GET", "/v2/models/batched/stats")
        finally:
            d.stop()
        port = free_port()
        instant = subprocess.Popen([sys.executable, "-c", INSTANT, str(port)], stdout=subprocess.PIPE, text=True)
        try:
            assert instant.stdout.readline().strip() == "ready"
            floor = asyncio.run(drive(f"127.0.0.1:{port}", "instant", args.clients, args.seconds, paced_rate))
        finally:
            instant.terminate()
            instant.wait()
    print(f"MLP 256-{args.hidden}-{args.hidden}-16; {args.clients} clients of one row each, {args.seconds:.0f} s "
          f"each; one batch of {args.max_batch} rows computes in {compute * 1e3:.2f} ms (onnxruntime in-process)")
    for name, (rate, latencies) in results.items():
        q = np.percentile(latencies, [50, 99]) * 1e3
        print(f"  {name:8s} {rate:8.0f} req/s   p50 {q[0]:7.2f} ms   p99 {q[1]:7.2f} ms")
    entry = stats["model_stats"][0]
    sizes = sorted(((b["batch_size"], b["compute_infer"]["count"]) for b in entry["batch_stats"]),
                   key=lambda item: -item[1])[:5]
    print(f"  batched: {entry['execution_count']} executions for {entry['inference_count']} rows; "
          f"commonest batch sizes (size, executions): {sizes}")
    ratio = results["batched"][0] / results["plain"][0]
    bound = args.delay_us / 1e6 + 2 * compute
    print(f"throughput batched / plain: {ratio:.2f}  (target >= 3)  {'PASS' if ratio >= 3 else 'FAIL'}")
    for what, latencies in (("back to back", results["batched"][1]),
                            (f"paced at {paced_rate:.0f} req/s ({paced[0]:.0f} done)", paced[1])):
        p99 = np.percentile(latencies, 99)
        print(f"batched p99, {what}: {p99 * 1e3:.2f} ms vs max_queue_delay + 2 x batch compute = "
              f"{bound * 1e3:.2f} ms  {'PASS' if p99 <= bound else 'FAIL'}")
    q = np.percentile(floor[1], [50, 99]) * 1e3
    print(f"the floor at that pace: the same clients against a server that answers at once (no model, no daemon): "
          f"p50 {q[0]:.2f} ms, p99 {q[1]:.2f} ms")


if __name__ == "__main__":
    main()
