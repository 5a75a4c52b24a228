"""bench_infer.py section 8: the v2 gRPC service against HTTP on the same
daemon and echo model, and against MLServer 1.7's gRPC.

The same request both ways: 16 FP32 values, then 4 MiB of FP32, binary
(HTTP: the binary tensor data extension through the daemon's own lean
HTTP/1.1 client, tests/bench/http11.py; gRPC: grpcio's asyncio stub with
raw_input_contents, a ModelInferRequest built once). Like against like:
Unix socket against Unix socket, TCP against TCP, one connection per
client. Rounds alternate which goes first. Targets: gRPC 16-float p50
within 1.3x HTTP's and 1.15x a bare grpcio echo server's, daemon CPU per
16-float request within 1.3x HTTP's; 4 MiB throughput at least 0.8x HTTP's; against
MLServer's gRPC (its echo MLModel, TCP), p50 and 4 MiB throughput at least
as good.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from bench_daemon import cpu_seconds
from http11 import CLIENTS, Address

Request = Callable[[], Awaitable[None]]
MIB = 1 << 20


def _grpc_modules():  # noqa: ANN202 - imported here: the other sections never need grpc
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    return grpc, service_pb2, service_pb2_grpc


def grpc_request(values: np.ndarray, model: str = "echo") -> Any:
    _, pb, _ = _grpc_modules()
    req = pb.ModelInferRequest(model_name=model)
    req.inputs.add(name="x_float32", datatype="FP32", shape=[1, values.size])
    req.outputs.add(name="y_float32")
    req.raw_input_contents.append(values.tobytes())
    return req


class GrpcClient:
    """One channel (one HTTP/2 connection), its stub and the request it sends."""

    def __init__(self, target: str, values: np.ndarray) -> None:
        grpc, _, pb_grpc = _grpc_modules()
        # the strongest client settings: 16 MiB HTTP/2 frames and a wide window, as the daemon's own
        options = [("grpc.max_receive_message_length", 64 * MIB), ("grpc.max_send_message_length", 64 * MIB),
                   ("grpc.http2.max_frame_size", (1 << 24) - 1), ("grpc.http2.lookahead_bytes", 64 * MIB),
                   ("grpc.http2.bdp_probe", 0)]
        self.channel = grpc.aio.insecure_channel(target, options=options)
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        self.request = grpc_request(values)
        self.size = values.nbytes

    async def once(self) -> None:
        answer = await self.stub.ModelInfer(self.request)
        if len(answer.raw_output_contents[0]) != self.size:
            raise AssertionError(f"gRPC answer of {len(answer.raw_output_contents[0])} bytes, not {self.size}")

    async def close(self) -> None:
        await self.channel.close()


class HttpClient:
    def __init__(self, address: Address, body: bytes, headers: dict[str, str], size: int) -> None:
        self.address, self.body, self.headers, self.size = address, body, headers, size
        self.conn = None

    async def open(self) -> HttpClient:
        self.conn = await CLIENTS["raw"].open(self.address)
        return self

    async def once(self) -> None:
        status, _, body = await self.conn.request("POST", "/v2/models/echo/infer", self.body, self.headers)
        if status != 200 or len(body) < self.size:
            raise AssertionError(f"HTTP {status}, {len(body)} bytes")

    async def close(self) -> None:
        await self.conn.close()


async def _make(kind: str, where: object,
                payload: tuple[np.ndarray, bytes, dict[str, str]]) -> GrpcClient | HttpClient:
    values, body, headers = payload
    if kind == "grpc":
        return GrpcClient(where, values)   # type: ignore[arg-type]  # a gRPC side is named by its target string
    return await HttpClient(where, body, headers, values.nbytes).open()   # type: ignore[arg-type]  # by its Address


async def _latency(kind: str, where: object, payload: tuple, n: int, warmup: int) -> list[float]:
    client = await _make(kind, where, payload)
    try:
        for _ in range(warmup):
            await client.once()
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await client.once()
            out.append((time.perf_counter() - t) * 1000)
        return out
    finally:
        await client.close()


async def _throughput(kind: str, where: object, payload: tuple, clients: int, seconds: float) -> float:
    """Requests per second, ``clients`` connections each sending one after another."""
    made = [await _make(kind, where, payload) for _ in range(clients)]
    try:
        for c in made:
            await c.once()
        done = 0
        deadline = time.perf_counter() + seconds

        async def loop(c) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await c.once()
                done += 1
        started = time.perf_counter()
        await asyncio.gather(*(loop(c) for c in made))
        return done / (time.perf_counter() - started)
    finally:
        for c in made:
            await c.close()


def compare(sides: dict[str, tuple[str, object]], small: tuple, big: tuple, a, clients: list[int],
            title: str, server_pid: int | None = None, cpu: dict[str, float] | None = None,
            ) -> tuple[dict[str, float], dict[tuple[str, int], float]]:
    """p50 (ms) and best 4 MiB req/s of each side, rounds alternating the order;
    with ``server_pid``, its CPU per 16-float request of each side (µs) into ``cpu``."""
    lat: dict[str, list[float]] = {label: [] for label in sides}
    used: dict[str, float] = dict.fromkeys(sides, 0.0)
    rps: dict[tuple[str, int], float] = {}
    order = list(sides)
    print(title)
    for r in range(a.rounds):
        for label in order if r % 2 == 0 else order[::-1]:
            kind, where = sides[label]
            before = cpu_seconds(server_pid) if server_pid is not None else 0.0
            lat[label] += asyncio.run(_latency(kind, where, small, a.requests, a.warmup))
            if server_pid is not None:
                used[label] += cpu_seconds(server_pid) - before
    p50 = {label: statistics.median(v) for label, v in lat.items()}
    for label in order:
        v = sorted(lat[label])
        per = used[label] / (a.rounds * (a.requests + a.warmup)) * 1e6
        if cpu is not None:
            cpu[label] = per
        shown = f", server CPU {per:.0f} us/req" if server_pid is not None else ""
        print(f"  {label:34s} 16 FP32: p50 {p50[label]:.3f} ms, p99 {v[int(len(v) * 0.99) - 1]:.3f} ms{shown}")
    for c in clients:
        for r in range(a.rounds):
            for label in order if r % 2 == 0 else order[::-1]:
                kind, where = sides[label]
                got = asyncio.run(_throughput(kind, where, big, c, a.seconds))
                rps[(label, c)] = max(rps.get((label, c), 0.0), got)
        for label in order:
            print(f"  {label:34s} 4 MiB, {c} client(s): {rps[(label, c)]:.1f} req/s, "
                  f"{rps[(label, c)] * big[0].nbytes / MIB:.0f} MiB/s")
    return p50, rps


def floor(small: tuple, big: tuple, a, clients: list[int],
          cpu: dict[str, float]) -> tuple[dict[str, float], dict]:
    """The bare grpcio echo server (grpc_floor.py), same client: what grpcio
    costs alone (its CPU per 16-float request into ``cpu``)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "grpc_floor.py")], stdout=subprocess.PIPE,
                            text=True)
    try:
        target = f"127.0.0.1:{int(proc.stdout.readline())}"
        return compare({"bare grpcio echo (tcp)": ("grpc", target)}, small, big, a, clients,
                       "8. the floor: a bare grpcio server answering its input, no model, no runner:", proc.pid,
                       cpu)
    finally:
        proc.kill()
        proc.wait()


def run(d, work: Path, small_bin, big_bin, a, clients: list[int], verdict: Callable,
        mlserver: Callable[[], tuple[object, str] | None]) -> None:
    """``d``: a daemon serving echo with --grpc-listen; ``mlserver``: starts
    MLServer, giving (its process, its gRPC target) or None."""
    small = (small_bin.values, small_bin.body, small_bin.headers)
    big = (big_bin.values, big_bin.body, big_bin.headers)
    floor_cpu: dict[str, float] = {}
    floor_p50, floor_rps = floor(small, big, a, clients, floor_cpu)
    print()
    host, port = d.host_port.rsplit(":", 1)
    for transport, http_where, grpc_where in (
            ("unix", Address(unix=str(d.socket_path)), d.grpc_unix),
            ("tcp", Address(host=host, port=int(port)), d.grpc_host_port)):
        http_label, grpc_label = f"HTTP ({transport})", f"gRPC ({transport})"
        cpu: dict[str, float] = {}
        p50, rps = compare({http_label: ("http", http_where), grpc_label: ("grpc", grpc_where)}, small, big, a,
                           clients, f"8. gRPC vs HTTP, same daemon and model, {transport}:", d.proc.pid, cpu)
        ratio = p50[grpc_label] / p50[http_label]
        verdict(f"8. gRPC 16-float p50 <= 1.3x HTTP ({transport})", ratio <= 1.3,
                f"{ratio:.2f}x ({p50[grpc_label]:.3f} vs {p50[http_label]:.3f} ms)")
        bare = floor_p50["bare grpcio echo (tcp)"]
        verdict(f"8. gRPC 16-float p50 <= 1.15x a bare grpcio echo's ({transport})", p50[grpc_label] <= 1.15 * bare,
                f"{p50[grpc_label] / bare:.2f}x ({p50[grpc_label]:.3f} vs {bare:.3f} ms)")
        cpu_ratio = cpu[grpc_label] / cpu[http_label]
        verdict(f"8. daemon CPU per 16-float request, gRPC <= 1.3x HTTP ({transport})", cpu_ratio <= 1.3,
                f"{cpu_ratio:.2f}x ({cpu[grpc_label]:.0f} vs {cpu[http_label]:.0f} us)")
        bare_cpu = floor_cpu["bare grpcio echo (tcp)"]
        verdict(f"8. floor: a bare grpcio echo server's CPU per 16-float request / the daemon's over HTTP "
                f"({transport})", None,
                f"{bare_cpu / cpu[http_label]:.2f}x ({bare_cpu:.0f} vs {cpu[http_label]:.0f} us)")
        verdict(f"8. floor: bare grpcio echo p50 / HTTP p50 through the daemon and runner ({transport})", None,
                f"{bare / p50[http_label]:.2f}x ({bare:.3f} vs {p50[http_label]:.3f} ms)")
        for c in clients:
            x = rps[(grpc_label, c)] / rps[(http_label, c)]
            verdict(f"8. gRPC 4 MiB throughput >= 0.8x HTTP ({transport}, {c} client(s))", x >= 0.8,
                    f"{x:.2f}x ({rps[(grpc_label, c)]:.1f} vs {rps[(http_label, c)]:.1f} req/s)")
            f = floor_rps[("bare grpcio echo (tcp)", c)]
            verdict(f"8. floor: bare grpcio echo 4 MiB / HTTP through the daemon ({transport}, {c} client(s))", None,
                    f"{f / rps[(http_label, c)]:.2f}x ({f:.1f} vs {rps[(http_label, c)]:.1f} req/s); "
                    f"daemon gRPC / bare grpcio {rps[(grpc_label, c)] / f:.2f}x")
        print()
    started = mlserver()
    if started is None:
        print("8. MLServer gRPC: skipped\n")
        return
    _, target = started   # the caller stops it
    ours = "cartonstore gRPC (tcp)"
    p50, rps = compare({ours: ("grpc", d.grpc_host_port), "MLServer gRPC (tcp)": ("grpc", target)}, small, big, a,
                       clients, "8. cartonstore gRPC vs MLServer 1.7 gRPC, echo model, TCP:")
    ratio = p50[ours] / p50["MLServer gRPC (tcp)"]
    verdict("8. gRPC 16-float p50 <= 1x MLServer's gRPC", ratio <= 1.0,
            f"{ratio:.2f}x ({p50[ours]:.3f} vs {p50['MLServer gRPC (tcp)']:.3f} ms)")
    for c in clients:
        x = rps[(ours, c)] / rps[("MLServer gRPC (tcp)", c)]
        verdict(f"8. gRPC 4 MiB throughput >= 1x MLServer's gRPC ({c} client(s))", x >= 1.0,
                f"{x:.2f}x ({rps[(ours, c)]:.1f} vs {rps[('MLServer gRPC (tcp)', c)]:.1f} req/s)")
    print()
