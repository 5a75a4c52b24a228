#!/usr/bin/env python3
"""Benchmark: inference through the daemon vs straight to its runner, and vs MLServer 1.7.

Targets (issue), each against a baseline measured in the same run:
  1. proxy overhead: echo model, 16 FP32 values, binary, N sequential
     requests on one keep-alive connection through the daemon's Unix socket
     vs straight to the runner's Unix socket: overhead p50 = daemon p50 -
     direct p50 <= 0.25 ms (p99 reported too);
  2. 4 MiB FP32 in and out, binary, 1 and 4 concurrent clients: daemon
     throughput >= 0.8 x direct-to-runner throughput;
  3. MLServer 1.7 (own virtualenv, installed here if missing; never a
     project dependency) serving an echo MLModel, vs cartonstore over
     loopback TCP, same client: cartonstore 4 MiB throughput >= 2x
     MLServer's and 16-float p50 <= half of MLServer's;
  4. (figures) idle RSS of one runner, and of the daemon with 10 models loaded;
  5. 64 MiB FP32 in and out through Triton's system shared memory vs a
     bare numpy copy and vs binary over the socket (shm_section.py);
  6. (figures) a carton's 10 self-tests of 1 MiB run by the daemon vs the
     same requests straight to the runner (selftest_section.py);
  7. the runner sandbox's cost (sandbox_section.py);
  8. gRPC vs HTTP on the same daemon and model (Unix and TCP), and vs
     MLServer 1.7's gRPC (grpc_section.py).

    python tests/bench/bench_infer.py [--quick] [--requests 2000] [--seconds 5] [--rounds 2]
        [--only proxy|shm|selftest|sandbox|grpc]

Every request goes through tests/bench/http11.py: the daemon's own lean
HTTP/1.1 client (--client aiohttp for the stock one), one connection per client, in
this process. Rounds alternate which server goes first. Latency figures pool
every round's samples; throughput figures are the best round's. CPU per
request of each server process (from /proc/<pid>/stat) says where time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
sys.path[:0] = [str(REPO), str(HERE.parents[1]), str(HERE.parent)]

import grpc_section
import numpy as np
import sandbox_section
import selftest_section
import shm_section
from bench_daemon import cpu_seconds, percentile, rss_mib, stop_proc
from http11 import CLIENTS, Address
from mlserver_echo import (
    MLSERVER_VENV,
    children,
    ensure_mlserver,
    start_mlserver,
    stop_group,
)

MIB = 1 << 20
SMALL, BIG = 16, MIB          # FP32 values: 64 bytes, 4 MiB
HL = "Inference-Header-Content-Length"
INFER = "/v2/models/{}/infer"

# -- request bodies -------------------------------------------------------------------


@dataclass(frozen=True)
class Payload:
    values: np.ndarray
    body: bytes
    headers: dict[str, str]
    binary: bool

    @property
    def mib(self) -> float:
        return self.values.nbytes / MIB


def payload(count: int, binary: bool) -> Payload:
    values = (np.arange(count) % 1000 * 0.25).astype(np.float32)  # short exact decimals in JSON
    tensor = {"name": "x_float32", "datatype": "FP32", "shape": [1, count]}
    if binary:
        header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": values.nbytes}}],
                             "outputs": [{"name": "y_float32", "parameters": {"binary_data": True}}]}).encode()
        return Payload(values, header + values.tobytes(),
                       {HL: str(len(header)), "Content-Type": "application/octet-stream"}, True)
    body = json.dumps({"inputs": [{**tensor, "data": values.tolist()}]}).encode()
    return Payload(values, body, {"Content-Type": "application/json"}, False)


def echoed(answer: tuple[int, dict[str, str], bytes], p: Payload) -> str | None:
    """None when the answer holds y_float32 equal to the input, else why not."""
    status, headers, body = answer
    if status != 200:
        return f"HTTP {status}: {body[:300]!r}"
    try:
        length = int(headers[HL.lower()]) if HL.lower() in headers else len(body)
        out = json.loads(body[:length])["outputs"][0]
        if "data" in out:
            got = np.asarray(out["data"], dtype=np.float32).reshape(-1)
        else:
            size = out["parameters"]["binary_data_size"]
            got = np.frombuffer(body[length:length + size], dtype=np.float32)
    except Exception as e:  # noqa: BLE001 - any shape of wrong answer
        return f"unreadable answer ({type(e).__name__}: {e}): {body[:300]!r}"
    return None if np.array_equal(got, p.values) else f"output differs from input ({got[:4]}...)"


# -- measuring ------------------------------------------------------------------------


class CpuMeter:
    """CPU seconds spent by server processes (and this one) between start and stop."""

    def __init__(self, pids: dict[str, list[int] | Callable[[], list[int]]]) -> None:
        self.pids = pids

    def _now(self) -> dict[str, float]:
        out = {}
        for label, pids in self.pids.items():
            total = 0.0
            for pid in pids() if callable(pids) else pids:
                try:
                    total += cpu_seconds(pid)
                except OSError:
                    pass
            out[label] = total
        t = os.times()
        out["client"] = t.user + t.system
        return out

    def __enter__(self) -> Self:
        self.before = self._now()
        return self

    def __exit__(self, *exc: object) -> None:
        after = self._now()
        self.used = {k: after[k] - self.before[k] for k in after}

    def per_request_us(self, requests: int) -> str:
        return ", ".join(f"{k} {v / max(1, requests) * 1e6:.0f}" for k, v in self.used.items())


@dataclass
class Server:
    label: str
    address: Address
    model: str
    pids: dict[str, list[int] | Callable[[], list[int]]]


def daemon_and_workers(pid: int) -> Callable[[], list[int]]:
    """The daemon and, as they are now, its check workers (started on first
    use): their CPU is the daemon's work done on other cores. A worker
    started during a run counts its start (~0.2 CPU-s) there too."""
    def is_worker(child: int) -> bool:
        try:
            return b"check_worker" in Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            return False

    def pids() -> list[int]:
        return [pid, *filter(is_worker, children(pid))]
    return pids


async def _sequential(server: Server, p: Payload, n: int, warmup: int, client: str) -> list[float]:
    conn = await CLIENTS[client].open(server.address)
    path = INFER.format(server.model)
    try:
        why = echoed(await conn.request("POST", path, p.body, p.headers), p)
        if why:
            raise SystemExit(f"{server.label}: {why}")
        for _ in range(warmup):
            await conn.request("POST", path, p.body, p.headers)
        lat = []
        pc = time.perf_counter
        for _ in range(n):
            t0 = pc()
            status, _, _ = await conn.request("POST", path, p.body, p.headers)
            lat.append((pc() - t0) * 1000)
            if status != 200:
                raise SystemExit(f"{server.label}: HTTP {status} during the latency run")
        return lat
    finally:
        await conn.close()


async def _closed_loop(server: Server, p: Payload, clients: int, seconds: float, client: str) -> tuple[int, float]:
    conns = [await CLIENTS[client].open(server.address) for _ in range(clients)]
    path = INFER.format(server.model)
    try:
        for conn in conns:  # warm every connection; check the first answer
            why = echoed(await conn.request("POST", path, p.body, p.headers), p)
            if why:
                raise SystemExit(f"{server.label}: {why}")
        pc = time.perf_counter
        count = 0
        t0 = pc()
        end = t0 + seconds

        async def loop(conn) -> None:
            nonlocal count
            while pc() < end:
                status, _, _ = await conn.request("POST", path, p.body, p.headers)
                if status != 200:
                    raise SystemExit(f"{server.label}: HTTP {status} during the throughput run")
                count += 1

        await asyncio.gather(*(loop(c) for c in conns))
        return count, pc() - t0
    finally:
        for conn in conns:
            await conn.close()


def latency_run(server: Server, p: Payload, a: argparse.Namespace) -> dict:
    with CpuMeter(server.pids) as cpu:
        lat = asyncio.run(_sequential(server, p, a.requests, a.warmup, a.client))
    return {"lat": lat, "cpu": cpu.per_request_us(a.requests + a.warmup + 1)}


def throughput_run(server: Server, p: Payload, clients: int, a: argparse.Namespace) -> dict:
    with CpuMeter(server.pids) as cpu:
        count, wall = asyncio.run(_closed_loop(server, p, clients, a.seconds, a.client))
    rps = count / wall
    return {"rps": rps, "mibps": rps * p.mib, "count": count, "cpu": cpu.per_request_us(count + clients)}


def lat_summary(lat: list[float]) -> dict[str, float]:
    s = sorted(lat)
    return {"p50": percentile(s, 0.50), "p90": percentile(s, 0.90), "p99": percentile(s, 0.99), "n": len(s)}


def fmt_lat(s: dict) -> str:
    return f"p50 {s['p50']:.3f}  p90 {s['p90']:.3f}  p99 {s['p99']:.3f} ms  (n={s['n']})"


def fmt_tput(r: dict) -> str:
    return f"{r['rps']:7.1f} req/s  {r['mibps']:7.1f} MiB/s each way  (CPU us/req: {r['cpu']})"


def compare_latency(servers: list[Server], p: Payload, a: argparse.Namespace, title: str) -> dict[str, dict]:
    """Sequential requests, alternating servers round by round; pooled figures."""
    pooled: dict[str, list[float]] = {s.label: [] for s in servers}
    print(title, flush=True)
    for rnd in range(a.rounds):
        for s in servers if rnd % 2 == 0 else servers[::-1]:
            r = latency_run(s, p, a)
            pooled[s.label] += r["lat"]
            print(f"  round {rnd + 1} {s.label:22} {fmt_lat(lat_summary(r['lat']))}  CPU us/req: {r['cpu']}",
                  flush=True)
    out = {k: lat_summary(v) for k, v in pooled.items()}
    for k, v in out.items():
        print(f"  pooled  {k:22} {fmt_lat(v)}")
    return out


def compare_throughput(servers: list[Server], p: Payload, clients: int, a: argparse.Namespace,
                       title: str) -> dict[str, dict]:
    best: dict[str, dict] = {}
    print(title, flush=True)
    for rnd in range(a.rounds):
        for s in servers if rnd % 2 == 0 else servers[::-1]:
            r = throughput_run(s, p, clients, a)
            if s.label not in best or r["rps"] > best[s.label]["rps"]:
                best[s.label] = r
            print(f"  round {rnd + 1} {s.label:22} {fmt_tput(r)}", flush=True)
    return best


# -- processes ------------------------------------------------------------------------


async def _post_json(address: Address, path: str, doc: dict) -> tuple[int, bytes]:
    conn = await CLIENTS["raw"].open(address)
    try:
        status, _, body = await conn.request("POST", path, json.dumps(doc).encode(),
                                             {"Content-Type": "application/json"})
        return status, body
    finally:
        await conn.close()


def load_model(sock: Path, name: str, source: Path) -> None:
    status, body = asyncio.run(_post_json(Address(unix=str(sock)), f"/v2/repository/models/{name}/load",
                                          {"parameters": {"source": str(source)}}))
    if status != 200:
        raise SystemExit(f"loading {name} failed: HTTP {status} {body[:500]!r}")


def runner_of(root: Path, name: str) -> tuple[Path, int]:
    from kit.inferkit import runner_sockets
    from kit.prockit import live_pids

    sock = next(p for p in runner_sockets(root) if p.name.startswith(name + ".g"))
    pids = live_pids(str(sock))
    if len(pids) != 1:
        raise SystemExit(f"expected one runner process for {sock}, found {pids}")
    return sock, pids[0]


# -- MLServer ----------------------------------------------------------------------


def mlserver_accepts_binary(address: Address) -> str | None:
    """None when MLServer echoes a binary-extension request correctly, else what it answered."""
    p = payload(SMALL, True)

    async def go() -> tuple[int, dict[str, str], bytes]:
        conn = await CLIENTS["raw"].open(address)
        try:
            return await conn.request("POST", INFER.format("echo"), p.body, p.headers)
        finally:
            await conn.close()
    return echoed(asyncio.run(go()), p)


# -- the driver -----------------------------------------------------------------------


def verdict(rows: list, name: str, ok: bool | None, value: str) -> None:
    """A line of the closing table; ok None: a figure with no target."""
    rows.append((name, ok, value))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="sequential requests per latency run (default 2000)")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per throughput run (default 5)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", default="1,4", help="concurrent clients for the 4 MiB runs (default 1,4)")
    ap.add_argument("--models", type=int, default=10, help="models loaded for the daemon RSS figure (default 10)")
    ap.add_argument("--client", choices=sorted(CLIENTS), default="raw")
    ap.add_argument("--quick", action="store_true", help="500 requests, 2 s runs, 1 round")
    ap.add_argument("--no-mlserver", action="store_true")
    ap.add_argument("--mlserver-venv", type=Path, default=MLSERVER_VENV)
    ap.add_argument("--mlserver-workers", type=int, default=None,
                    help="MLServer parallel_workers (default: MLServer's own default)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--shm-requests", type=int, default=20, help="64 MiB requests per way in section 5 (default 20)")
    ap.add_argument("--only", choices=["proxy", "shm", "selftest", "sandbox", "grpc"],
                    help="sections 1 and 2 (proxy), 5 (shm), 6 (selftest), 7 (sandbox) or 8 (grpc, with MLServer's "
                         "gRPC) alone")
    a = ap.parse_args()
    a.no_mlserver_given = a.no_mlserver
    if a.quick:
        a.requests, a.warmup, a.seconds, a.rounds = 500, 100, 2.0, 1
    client_counts = [int(c) for c in a.clients.split(",") if c.strip()]

    from kit.daemonkit import DaemonProcess
    from kit.inferkit import echo_carton, runner_pids

    from cartonstore.server.http.event_loop import loop_name
    from cartonstore.store.materialize.tree import remove_tree

    if a.workdir:  # a --workdir that does not exist yet is created
        Path(a.workdir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cs-bench-i-", dir=a.workdir))
    # Sections 1-6 run unsandboxed runners (what they measure is the proxy
    # path); section 7 measures what the sandbox adds.
    env = {"PYTHONPATH": str(REPO), "CARTONSTORE_SANDBOX": "none"}
    daemons: list[DaemonProcess] = []
    mlserver: subprocess.Popen | None = None
    helpers: list[subprocess.Popen] = []
    verdicts: list = []
    small_bin, big_bin = payload(SMALL, True), payload(BIG, True)
    try:
        print(f"cartonstore inference bench: {len(os.sched_getaffinity(0))} cores, client {a.client!r}, "
              f"{a.requests} requests per latency run (+{a.warmup} warmup), {a.seconds:g} s per throughput run, "
              f"{a.rounds} round(s); load average {os.getloadavg()[0]:.2f}")
        print("CPU us/req: CPU time per request of each process (client = this process, the load generator)\n")

        # -- 1 and 2: daemon vs its own runner, Unix sockets -------------------------
        root = work / "root"
        d = DaemonProcess(root, listen="127.0.0.1:0", socket_path=work / "cs.sock", env=env,
                          extra_args=["--grpc-listen", "127.0.0.1:0"]).start()
        daemons.append(d)
        load_model(d.socket_path, "echo", echo_carton(work / "echo", dtypes=["float32"]))
        rsock, rpid = runner_of(root, "echo")
        via_daemon = Server("daemon (unix)", Address(unix=str(d.socket_path)), "echo",
                            {"daemon": daemon_and_workers(d.proc.pid), "runner": [rpid]})
        direct = Server("runner direct (unix)", Address(unix=str(rsock)), "echo", {"runner": [rpid]})

        # The floor: a Python process that only forwards bytes, on the daemon's event loop.
        floor = subprocess.Popen([sys.executable, str(HERE.parent / "floor_proxy.py"), str(work / "floor.sock"),
                                  str(rsock), "--loop", loop_name()], stdout=subprocess.PIPE, text=True)
        helpers.append(floor)
        floor.stdout.readline()
        via_floor = Server(f"floor proxy ({loop_name()})", Address(unix=str(work / "floor.sock")), "echo",
                           {"proxy": [floor.pid], "runner": [rpid]})
        print(f"daemon event loop: {loop_name()}; floor proxy: forwards bytes only, no HTTP parsed, same loop\n")

        if a.only:
            a.no_mlserver, a.models = True, 1
        if a.only in (None, "proxy"):
            lat = compare_latency([via_daemon, direct, via_floor], small_bin, a,
                                  f"1. latency, {SMALL} FP32 binary, sequential, one keep-alive connection:")
            overhead50 = lat[via_daemon.label]["p50"] - lat[direct.label]["p50"]
            overhead99 = lat[via_daemon.label]["p99"] - lat[direct.label]["p99"]
            floor50 = lat[via_floor.label]["p50"] - lat[direct.label]["p50"]
            print(f"  overhead p50 = {overhead50:.3f} ms, p99 = {overhead99:.3f} ms; "
                  f"daemon/direct p50 ratio {lat[via_daemon.label]['p50'] / lat[direct.label]['p50']:.2f}")
            print(f"  floor proxy overhead p50 = {floor50:.3f} ms: the daemon's own work adds "
                  f"{overhead50 - floor50:.3f} ms above it\n")
            verdict(verdicts, "1. floor: a byte-forwarding Python proxy's overhead p50", None, f"{floor50:.3f} ms")
            verdict(verdicts, "1. proxy overhead p50 <= 0.25 ms", overhead50 <= 0.25, f"{overhead50:.3f} ms "
                    f"(daemon {lat[via_daemon.label]['p50']:.3f} - direct {lat[direct.label]['p50']:.3f})")

        if a.only in (None, "grpc"):
            def mlserver_grpc() -> tuple[subprocess.Popen, str] | None:
                nonlocal mlserver
                if a.no_mlserver and (a.only != "grpc" or a.no_mlserver_given):
                    return None
                exe, how = ensure_mlserver(a.mlserver_venv, work)
                if exe is None:
                    print(f"8. MLServer: cannot install it: {how}")
                    return None
                mlserver, _, grpc_port = start_mlserver(exe, work / "ml-grpc", a.mlserver_workers)
                return mlserver, f"127.0.0.1:{grpc_port}"
            grpc_section.run(d, work, small_bin, big_bin, a, client_counts, lambda *row: verdict(verdicts, *row),
                             mlserver_grpc)
            stop_group(mlserver)
            mlserver = None
        if a.only in (None, "sandbox"):
            sandbox_section.run(work, {"PYTHONPATH": str(REPO)}, a.requests, (small_bin.body, small_bin.headers),
                                load_model, lambda *row: verdict(verdicts, *row))
        if a.only in (None, "shm"):
            shm_section.run(d.socket_path, "echo", a.shm_requests, lambda *row: verdict(verdicts, *row))
        if a.only in (None, "selftest"):
            selftest_section.run(d.socket_path, work, 5, load_model, runner_of, lambda *row: verdict(verdicts, *row))
        for clients in client_counts if a.only in (None, "proxy") else ():
            best = compare_throughput([via_daemon, direct, via_floor], big_bin, clients, a,
                                      f"2. throughput, 4 MiB FP32 binary in and out, {clients} client(s):")
            ratio = best[via_daemon.label]["rps"] / best[direct.label]["rps"]
            floor_ratio = best[via_floor.label]["rps"] / best[direct.label]["rps"]
            print(f"  best: daemon {best[via_daemon.label]['mibps']:.1f} MiB/s, direct "
                  f"{best[direct.label]['mibps']:.1f} MiB/s; ratio daemon/direct {ratio:.2f} "
                  f"(floor proxy/direct {floor_ratio:.2f})\n")
            verdict(verdicts, f"2. floor: byte-forwarding proxy/direct, 4 MiB, {clients} client(s)", None,
                    f"{floor_ratio:.2f}")
            verdict(verdicts, f"2. 4 MiB throughput, {clients} client(s): daemon >= 0.8 x direct", ratio >= 0.8,
                    f"{ratio:.2f} ({best[via_daemon.label]['rps']:.1f} vs {best[direct.label]['rps']:.1f} req/s)")
        daemon_rss_after = rss_mib(d.proc.pid)
        runner_rss_after = rss_mib(rpid)

        # -- 3: MLServer vs cartonstore on loopback TCP ------------------------------
        if a.no_mlserver:
            print("3. MLServer: skipped (--no-mlserver)\n")
        else:
            exe, how = ensure_mlserver(a.mlserver_venv, work)
            if exe is None:
                print(f"3. MLServer: skipped, cannot install it: {how}\n")
            else:
                version = subprocess.run([str(a.mlserver_venv / "bin" / "python"), "-c",
                                          "import mlserver; print(mlserver.__version__)"],
                                         capture_output=True, text=True, check=False).stdout.strip()
                mlserver, ml_address, _ = start_mlserver(exe, work, a.mlserver_workers)
                ml_pids = [mlserver.pid, *children(mlserver.pid)]
                why_not_binary = mlserver_accepts_binary(ml_address)
                binary = why_not_binary is None
                wire = "binary tensor data extension" if binary else "JSON"
                print(f"3. MLServer {version} ({how}), {len(ml_pids)} process(es), parallel_workers "
                      f"{a.mlserver_workers if a.mlserver_workers is not None else 'default'}; wire format: {wire}"
                      + ("" if binary else f" (binary request answered: {why_not_binary[:200]})"))
                ml = Server("mlserver (tcp)", ml_address, "echo", {"mlserver": ml_pids})
                host, port = d.host_port.rsplit(":", 1)
                cs_pids = {"daemon": daemon_and_workers(d.proc.pid), "runner": [rpid]}
                cs = Server(f"cartonstore (tcp, {'bin' if binary else 'json'})", Address(host=host, port=int(port)),
                            "echo", cs_pids)
                small, big = payload(SMALL, binary), payload(BIG, binary)
                same_lat = compare_latency([cs, ml], small, a, f"3a. latency, {SMALL} FP32, {wire}, TCP:")
                print()
                speed = {}
                for clients in client_counts:
                    speed[clients] = compare_throughput([cs, ml], big, clients, a,
                                                        f"3b. throughput, 4 MiB FP32, {wire}, {clients} client(s):")
                    print()
                rows = [(cs.label, same_lat[cs.label], {c: speed[c][cs.label] for c in client_counts})]
                if not binary:  # cartonstore at its best too: binary against MLServer's JSON
                    csb = Server("cartonstore (tcp, bin)", cs.address, "echo", cs_pids)
                    bin_lat = compare_latency([csb], small_bin, a, f"3c. cartonstore binary, {SMALL} FP32, TCP:")
                    bin_speed = {c: compare_throughput([csb], big_bin, c, a, f"3d. cartonstore binary, 4 MiB, "
                                                       f"{c} client(s), TCP:")[csb.label] for c in client_counts}
                    rows.append((csb.label, bin_lat[csb.label], bin_speed))
                    print()
                ml_lat = same_lat[ml.label]
                for label, cl, sp in rows:
                    r50 = cl["p50"] / ml_lat["p50"]
                    print(f"  {label} vs MLServer ({wire}): p50 {cl['p50']:.3f} vs {ml_lat['p50']:.3f} ms "
                          f"(ratio {r50:.3f})")
                    verdict(verdicts, f"3. {label}: 16-float p50 <= 0.5 x MLServer", r50 <= 0.5,
                            f"{r50:.3f} ({cl['p50']:.3f} vs {ml_lat['p50']:.3f} ms)")
                    for c in client_counts:
                        x = sp[c]["rps"] / speed[c][ml.label]["rps"]
                        print(f"    4 MiB, {c} client(s): {sp[c]['mibps']:.1f} vs {speed[c][ml.label]['mibps']:.1f}"
                              f" MiB/s (ratio {x:.2f})")
                        verdict(verdicts, f"3. {label}: 4 MiB throughput, {c} client(s) >= 2 x MLServer", x >= 2,
                                f"{x:.2f} ({sp[c]['rps']:.2f} vs {speed[c][ml.label]['rps']:.2f} req/s)")
                print()
                stop_group(mlserver)
                mlserver = None
        d.stop()

        # -- 4: RSS ---------------------------------------------------------------------
        root2 = work / "root2"
        d2 = DaemonProcess(root2, listen=None, socket_path=work / "cs2.sock", env=env).start()
        daemons.append(d2)
        time.sleep(0.5)
        daemon_idle = rss_mib(d2.proc.pid)
        for i in range(a.models):
            load_model(d2.socket_path, f"m{i}", echo_carton(work / f"m{i}", label=f"model {i}", dtypes=["float32"]))
        time.sleep(2.0)  # let start-up garbage settle
        runners = [rss_mib(pid) for pid in runner_pids(root2)]
        daemon_loaded = rss_mib(d2.proc.pid)
        print("4. RSS (VmRSS, MiB):")
        print(f"  daemon: idle with no model {daemon_idle:.1f}; with {a.models} models loaded {daemon_loaded:.1f} "
              f"({(daemon_loaded - daemon_idle) / max(1, a.models):.2f} per model)")
        print(f"  runners ({len(runners)}), idle after load: min {min(runners):.1f}, median "
              f"{sorted(runners)[len(runners) // 2]:.1f}, max {max(runners):.1f}; all {a.models} together "
              f"{sum(runners):.1f}")
        print(f"  (after sections 1-3) daemon {daemon_rss_after:.1f}, its runner {runner_rss_after:.1f}\n")
        verdict(verdicts, "4. one idle runner RSS (median)", None, f"{sorted(runners)[len(runners) // 2]:.1f} MiB")
        verdict(verdicts, f"4. daemon RSS with {a.models} models loaded", None, f"{daemon_loaded:.1f} MiB")
        d2.stop()

        print("targets:")
        for name, ok, value in verdicts:
            print(f"  {'INFO' if ok is None else 'PASS' if ok else 'FAIL'}  {name}: {value}")
    finally:
        stop_group(mlserver)
        for helper in helpers:
            stop_proc(helper)
        for dp in daemons:
            if dp.proc is not None and dp.proc.poll() is None:
                stop_proc(dp.proc)
        for r in (work / "root", work / "root2"):
            left = runner_pids(r)
            if left:
                print(f"WARNING: runner processes left after the daemon stopped: {left}", file=sys.stderr)
        remove_tree(work)


if __name__ == "__main__":
    main()
