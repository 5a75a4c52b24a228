#!/usr/bin/env python3
"""Benchmark: the daemon's lease API under 64 concurrent clients vs bare aiohttp.

Issue 11 §3's targets, printed as "[ratio]" lines, are ratios to the bare
handler in the same run: one client p50 <= 1.5x; open loop at 1,000
lease+release pairs/s (--open-rates 2000, requests) p50 <= 1.5x and
p99 <= 2x; closed loop throughput >= 0.9x and p99 <= 1.25x. The absolute
targets below are the older ones of the daemon issue, still printed.

Target (issue): with a model cached, 64 concurrent clients taking and
releasing leases over the Unix socket get p50 <= 1 ms and p99 <= 5 ms per
request, and a throughput >= 60% of a bare aiohttp handler that returns a
constant on a Unix socket, measured in the same run. Idle RSS <= 80 MiB.

    python tests/bench/bench_daemon.py [--seconds 10] [--clients 64] [--rounds 2]

Three kinds of process, each started by this script:
  * the daemon: `cartonstore serve --root R --socket S`, with the fixture
    carton added as "fx" and materialized by one lease before measuring;
  * the baseline: `bench_daemon.py --baseline-server SOCK`, a bare aiohttp
    app with the same two routes returning constant JSON of the same shapes;
  * the load generator: `bench_daemon.py --load SOCK`, the same code for
    both servers: N asyncio tasks on one aiohttp session (UnixConnector,
    limit=N), each looping POST /v1/leases then DELETE /v1/leases/{id}.

Baseline and daemon run alternately, each freshly started per round. Each
is measured twice per round: "shared" (generator and server free to use
both cores, competing for them) and "pinned" (server on core 0, generator
on core 1). Reported: the best round's throughput and its latencies.

The load is closed-loop: each client sends its next request as soon as the
previous one answers, so by Little's law mean latency = clients/throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
FIXTURE = REPO.parent / "shared" / "fixtures" / "carton-repo-test.carton"
MODEL = "fx"
TTL = 60

# -- the baseline server ------------------------------------------------------------

BASE_LEASE = {"lease": "x" * 22, "path": "/tmp/cartonstore/models/" + "0" * 64,
              "manifest_sha256": "0" * 64, "expires_at": 1.0e9}


def baseline_server(sock_path: str) -> None:
    from aiohttp import web

    lease_body = json.dumps(BASE_LEASE).encode()

    async def take(_request: web.Request) -> web.Response:
        return web.Response(body=lease_body, content_type="application/json")

    async def release(_request: web.Request) -> web.Response:
        return web.Response(body=b"{}", content_type="application/json")

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/v1/leases", take)
        app.router.add_delete("/v1/leases/{lease}", release)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.UnixSite(runner, sock_path).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print("READY", flush=True)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(serve())


# -- the load generator ---------------------------------------------------------------


def percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def summary(lat: list[float]) -> dict[str, float]:
    s = sorted(lat)
    return {"p50": percentile(s, 0.50), "p90": percentile(s, 0.90), "p99": percentile(s, 0.99),
            "max": s[-1] if s else float("nan"), "mean": sum(s) / len(s) if s else float("nan")}


async def generate(sock_path: str, clients: int, seconds: float, warmup: float, rate: float | None = None) -> dict:
    """Closed loop (rate None): each client sends its next request when the
    last one answers. Open loop: together the clients offer ``rate``
    requests/s, each client a lease then a release every 2*clients/rate
    seconds from its own random phase; a take's latency counts from when it
    was due, so a stalled server is charged for the requests it delayed
    (no coordinated omission)."""
    import random

    import aiohttp

    take_ms: list[float] = []
    release_ms: list[float] = []
    errors: dict[str, int] = {}
    total = 0
    pc = time.perf_counter
    body = json.dumps({"model": MODEL, "ttl": TTL}).encode()
    headers = {"Content-Type": "application/json"}

    def err(what: str) -> None:
        errors[what] = errors.get(what, 0) + 1

    connector = aiohttp.UnixConnector(path=sock_path, limit=clients)
    async with aiohttp.ClientSession(connector=connector, base_url="http://cartonstore") as session:
        start = pc() + 0.2  # let every task be created before the clock starts
        t_measure = start + warmup
        t_end = t_measure + seconds

        async def client() -> None:
            nonlocal total
            period = 2 * clients / rate if rate else 0.0
            due = start + random.uniform(0, period)
            while pc() < due:
                await asyncio.sleep(due - pc())
            while True:
                if rate:
                    while pc() < due:
                        await asyncio.sleep(due - pc())
                    t0, due = due, due + period
                else:
                    t0 = pc()
                if t0 >= t_end:
                    return
                async with session.post("/v1/leases", data=body, headers=headers) as r:
                    status = r.status
                    data = await r.read()
                t1 = pc()
                total += 1
                if status != 200:
                    err(f"POST {status}")
                    continue
                lease = json.loads(data)["lease"]
                async with session.delete(f"/v1/leases/{lease}") as r:
                    status = r.status
                    await r.read()
                t2 = pc()
                total += 1
                if status != 200:
                    err(f"DELETE {status}")
                if t0 >= t_measure and t2 <= t_end:
                    take_ms.append((t1 - t0) * 1000)
                    release_ms.append((t2 - t1) * 1000)

        cpu0 = os.times()
        await asyncio.gather(*(client() for _ in range(clients)))
        cpu1 = os.times()
    count = len(take_ms) + len(release_ms)
    wall = pc() - start
    return {"clients": clients, "seconds": seconds, "count": count, "total_requests": total,
            "throughput": count / seconds, "rate": rate, "errors": errors,
            "generator_cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system), "wall_s": wall,
            "all": summary(take_ms + release_ms), "take": summary(take_ms), "release": summary(release_ms)}


def load_main(a: argparse.Namespace) -> None:
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    result = asyncio.run(generate(a.load, a.clients, a.seconds, a.warmup, a.rate))
    print(json.dumps(result), flush=True)


# -- the driver -----------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """utime+stime of the whole process (all threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def set_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of the process (sched_setaffinity on a pid moves one thread;
    threads created later inherit the affinity of the thread that creates them)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass


def run_load(sock: Path, server_pid: int, a: argparse.Namespace, pinned: bool, *,
             clients: int | None = None, seconds: float | None = None, rate: float | None = None) -> dict:
    all_cpus = os.sched_getaffinity(0)
    seconds = a.seconds if seconds is None else seconds
    cmd = [sys.executable, str(HERE), "--load", str(sock), "--clients", str(clients or a.clients),
           "--seconds", str(seconds), "--warmup", str(a.warmup)] + (["--rate", str(rate)] if rate else [])
    if pinned:
        set_affinity(server_pid, {0})
        cmd += ["--cpu", "1"]
    try:
        cpu0 = cpu_seconds(server_pid)
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=seconds + 120)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["server_cpu_s"] = cpu_seconds(server_pid) - cpu0
    finally:
        if pinned:
            set_affinity(server_pid, all_cpus)
    result["server_us_per_req"] = result["server_cpu_s"] / max(1, result["total_requests"]) * 1e6
    result["generator_us_per_req"] = result["generator_cpu_s"] / max(1, result["total_requests"]) * 1e6
    return result


def start_baseline(sock: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(HERE), "--baseline-server", str(sock)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "READY" not in line:
        proc.kill()
        raise SystemExit(f"baseline server did not start: {proc.communicate()[1][-2000:]}")
    return proc


def prime_lease(sock: Path) -> float:
    """Take and release one lease (materializes the model on first use); ms of the take."""
    import aiohttp

    async def go() -> float:
        conn = aiohttp.UnixConnector(path=str(sock))
        async with aiohttp.ClientSession(connector=conn, base_url="http://cartonstore") as s:
            t0 = time.perf_counter()
            async with s.post("/v1/leases", json={"model": MODEL, "ttl": TTL}) as r:
                if r.status != 200:
                    raise SystemExit(f"priming lease failed: {r.status} {await r.text()}")
                lease = (await r.json())["lease"]
            dt = (time.perf_counter() - t0) * 1000
            async with s.delete(f"/v1/leases/{lease}") as r:
                if r.status != 200:
                    raise SystemExit(f"releasing the priming lease failed: {r.status}")
            return dt

    return asyncio.run(go())


def stop_proc(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=10)


def fmt_lat(s: dict) -> str:
    return f"p50 {s['p50']:.2f}  p90 {s['p90']:.2f}  p99 {s['p99']:.2f}  max {s['max']:.1f} ms"


def fmt_run(r: dict) -> str:
    errs = f"  ERRORS {r['errors']}" if r["errors"] else ""
    return (f"{r['throughput']:8.0f} req/s  {fmt_lat(r['all'])}  | server CPU {r['server_us_per_req']:.0f} us/req,"
            f" generator CPU {r['generator_us_per_req']:.0f} us/req{errs}")


PAIRS_RATE = 2000.0   # issue 11 §3: 1,000 lease+release pairs per second offered, open loop


def _relative_verdicts(results: dict, single: dict, opened: dict, a: argparse.Namespace) -> list:
    """Issue 11 §3's targets, each a ratio to the bare handler measured by
    the same load driver in the same run (absolute figures move 2x from one
    hour to the next on this machine)."""
    out = []
    if a.single_seconds > 0:
        b = max(single["baseline"], key=lambda r: r["throughput"])["all"]["p50"]
        d = max(single["daemon"], key=lambda r: r["throughput"])["all"]["p50"]
        out.append(("[ratio] one client: p50 <= 1.5 x bare", d / b <= 1.5, f"{d / b:.2f} ({d:.2f} vs {b:.2f} ms)"))
    if PAIRS_RATE in opened["daemon"] and opened["daemon"][PAIRS_RATE]:
        b = max(opened["baseline"][PAIRS_RATE], key=lambda r: r["all"]["p99"])["all"]
        d = max(opened["daemon"][PAIRS_RATE], key=lambda r: r["all"]["p99"])["all"]
        for q, limit in (("p50", 1.5), ("p99", 2.0)):
            out.append((f"[ratio] open loop, {a.clients} clients, 1,000 pairs/s: {q} <= {limit} x bare",
                        d[q] / b[q] <= limit, f"{d[q] / b[q]:.2f} ({d[q]:.2f} vs {b[q]:.2f} ms, worst rounds)"))
    b = max(results["baseline"]["shared"], key=lambda r: r["throughput"])
    d = max(results["daemon"]["shared"], key=lambda r: r["throughput"])
    ratio, p99 = d["throughput"] / b["throughput"], d["all"]["p99"] / b["all"]["p99"]
    out.append((f"[ratio] closed loop, {a.clients} clients: throughput >= 0.9 x bare", ratio >= 0.9, f"{ratio:.2f}"))
    out.append((f"[ratio] closed loop, {a.clients} clients: p99 <= 1.25 x bare", p99 <= 1.25,
                f"{p99:.2f} ({d['all']['p99']:.2f} vs {b['all']['p99']:.2f} ms)"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run (default 10)")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--single-seconds", type=float, default=3.0,
                    help="also measure one client alone for this long (service time; 0: skip)")
    ap.add_argument("--no-pinned", action="store_true", help="skip the pinned (server core 0, generator core 1) runs")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--baseline-server", metavar="SOCK", help=argparse.SUPPRESS)
    ap.add_argument("--load", metavar="SOCK", help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--open-rates", default="1000,2000,3000,4000",
                    help="also offer these request rates (req/s, comma-separated) open loop from the same "
                         "clients: latency at a load below saturation (default 1000,2000,3000,4000; '' to skip)")
    ap.add_argument("--open-seconds", type=float, default=5.0)
    a = ap.parse_args()
    if a.baseline_server:
        return baseline_server(a.baseline_server)
    if a.load:
        return load_main(a)

    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(HERE.parents[1]))
    import aiohttp
    from daemonkit import DaemonProcess

    from cartonstore.store.materialize import remove_tree

    cpus = sorted(os.sched_getaffinity(0))
    modes = ["shared"] if a.no_pinned or len(cpus) < 2 else ["shared", "pinned"]
    env = {"PYTHONPATH": str(REPO)}
    if a.workdir:  # a --workdir that does not exist yet is created
        Path(a.workdir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cs-bench-d-", dir=a.workdir))
    procs: list = []
    results: dict[str, dict[str, list[dict]]] = {k: {m: [] for m in modes} for k in ("baseline", "daemon")}
    single: dict[str, list[dict]] = {"baseline": [], "daemon": []}
    rates = [float(r) for r in a.open_rates.split(",") if r.strip()]
    opened: dict[str, dict[float, list[dict]]] = {k: {r: [] for r in rates} for k in ("baseline", "daemon")}
    rss: dict[str, list[tuple[float, ...]]] = {"baseline": [], "daemon": []}
    try:
        root = work / "root"
        subprocess.run([sys.executable, "-m", "cartonstore.cli", "add", str(FIXTURE), "--name", MODEL,
                        "--root", str(root), "--progress", "none"], check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, **env})
        print(f"machine: {os.cpu_count()} cores (usable: {cpus}); python {sys.version.split()[0]}, "
              f"aiohttp {aiohttp.__version__}")
        print(f"load: {a.clients} clients, closed loop (lease then release), {a.warmup:g} s warm-up + "
              f"{a.seconds:g} s measured per run, {a.rounds} rounds, baseline and daemon alternately")
        print("NOTE: generator and server run on the same machine. In 'shared' runs they compete for "
              f"{len(cpus)} cores;\n      in 'pinned' runs the server has core 0 and the generator core 1. "
              "The generator's own CPU time\n      is in every latency figure.")
        print()
        for rnd in range(1, a.rounds + 1):
            # -- baseline
            bsock = work / f"base{rnd}.sock"
            base = start_baseline(bsock)
            procs.append(base)
            idle = rss_mib(base.pid)
            for m in modes:
                r = run_load(bsock, base.pid, a, m == "pinned")
                results["baseline"][m].append(r)
                print(f"round {rnd} baseline {m:6}: {fmt_run(r)}", flush=True)
            if a.single_seconds > 0:
                single["baseline"].append(run_load(bsock, base.pid, a, False, clients=1, seconds=a.single_seconds))
            for rate in rates:
                opened["baseline"][rate].append(run_load(bsock, base.pid, a, False, seconds=a.open_seconds, rate=rate))
            rss["baseline"].append((idle, rss_mib(base.pid)))
            stop_proc(base)
            # -- daemon
            dsock = work / f"d{rnd}.sock"
            d = DaemonProcess(root, listen=None, socket_path=dsock, env=env).start()
            procs.append(d.proc)
            idle = rss_mib(d.proc.pid)
            prime_ms = prime_lease(dsock)
            primed = rss_mib(d.proc.pid)
            for m in modes:
                r = run_load(dsock, d.proc.pid, a, m == "pinned")
                results["daemon"][m].append(r)
                print(f"round {rnd} daemon   {m:6}: {fmt_run(r)}", flush=True)
            if a.single_seconds > 0:
                single["daemon"].append(run_load(dsock, d.proc.pid, a, False, clients=1, seconds=a.single_seconds))
            for rate in rates:
                opened["daemon"][rate].append(run_load(dsock, d.proc.pid, a, False, seconds=a.open_seconds, rate=rate))
            time.sleep(0.5)
            rss["daemon"].append((idle, primed, rss_mib(d.proc.pid)))
            print(f"round {rnd} daemon first lease (model {'materialized' if rnd == 1 else 'already there'}): "
                  f"{prime_ms:.1f} ms", flush=True)
            d.stop()
        print()

        print("RSS (VmRSS, MiB):")
        for i, (idle, after) in enumerate(rss["baseline"], 1):
            print(f"  round {i} baseline: idle after start {idle:.1f}, after load {after:.1f}")
        for i, (idle, primed, after) in enumerate(rss["daemon"], 1):
            print(f"  round {i} daemon:   idle after start {idle:.1f}, after first lease {primed:.1f}, "
                  f"after load {after:.1f}")
        print()

        verdicts = []
        for m in modes:
            b = max(results["baseline"][m], key=lambda r: r["throughput"])
            d = max(results["daemon"][m], key=lambda r: r["throughput"])
            ratio = d["throughput"] / b["throughput"]
            print(f"[{m}] best of {a.rounds} rounds:")
            print(f"  baseline: {fmt_run(b)}")
            print(f"  daemon:   {fmt_run(d)}")
            print(f"    daemon take    {fmt_lat(d['take'])}")
            print(f"    daemon release {fmt_lat(d['release'])}")
            print(f"  throughput ratio daemon/baseline: {ratio:.2f}  (rounds: baseline "
                  f"{[round(r['throughput']) for r in results['baseline'][m]]}, daemon "
                  f"{[round(r['throughput']) for r in results['daemon'][m]]})")
            print(f"  Little's law: {a.clients} clients / {d['throughput']:.0f} req/s = "
                  f"{a.clients / d['throughput'] * 1000:.1f} ms mean latency (baseline "
                  f"{a.clients / b['throughput'] * 1000:.1f} ms); p50 <= 1 ms at {a.clients} clients "
                  f"needs >= {a.clients * 1000:,} req/s")
            verdicts += [(f"[{m}] p50 <= 1 ms", d["all"]["p50"] <= 1.0, f"{d['all']['p50']:.2f} ms"),
                         (f"[{m}] p99 <= 5 ms", d["all"]["p99"] <= 5.0, f"{d['all']['p99']:.2f} ms"),
                         (f"[{m}] throughput >= 0.60 x baseline", ratio >= 0.60, f"{ratio:.2f}"),
                         (f"[{m}] no errors", not d["errors"], str(d["errors"] or "none"))]
        if a.single_seconds > 0:
            print()
            print(f"(info) one client alone, {a.single_seconds:g} s, best round (per-request service time, no queueing):")
            for k in ("baseline", "daemon"):
                r = max(single[k], key=lambda r: r["throughput"])
                print(f"  {k:8}: {r['throughput']:6.0f} req/s  {fmt_lat(r['all'])}")
                if k == "daemon":
                    print(f"    daemon take    {fmt_lat(r['take'])}")
                    print(f"    daemon release {fmt_lat(r['release'])}")
        if rates:
            print()
            print(f"{a.clients} clients, open loop at a fixed offered rate (shared cores), worst of {a.rounds} "
                  f"rounds; latency counts from when each take was due:")
            meets: dict[str, float] = {}
            for rate in rates:
                for k in ("baseline", "daemon"):
                    rs = opened[k][rate]
                    worst = max(rs, key=lambda r: r["all"]["p99"])
                    ok = all(r["all"]["p50"] <= 1.0 and r["all"]["p99"] <= 5.0 and not r["errors"] for r in rs)
                    if ok:
                        meets[k] = max(meets.get(k, 0.0), rate)
                    print(f"  {rate:6.0f} req/s offered  {k:8}: {worst['throughput']:6.0f} req/s done  "
                          f"{fmt_lat(worst['all'])}  {'meets' if ok else 'misses'} p50 <= 1 / p99 <= 5"
                          + (f"  ERRORS {worst['errors']}" if worst["errors"] else ""))
            for k in ("baseline", "daemon"):
                print(f"  highest offered rate meeting p50 <= 1 ms and p99 <= 5 ms, {k}: "
                      f"{meets.get(k, 0):.0f} req/s")
            top = max(rates)
            verdicts.append((f"open loop, {a.clients} clients at up to {top:.0f} req/s: p50 <= 1 ms, p99 <= 5 ms",
                             meets.get("daemon", 0) >= top,
                             f"met up to {meets.get('daemon', 0):.0f} req/s (baseline: "
                             f"{meets.get('baseline', 0):.0f} req/s)"))
        verdicts += _relative_verdicts(results, single, opened, a)
        idle_max = max(r[0] for r in rss["daemon"])
        after_max = max(r[2] for r in rss["daemon"])
        verdicts += [("idle RSS after start <= 80 MiB", idle_max <= 80, f"{idle_max:.1f} MiB"),
                     ("(info) RSS after load <= 80 MiB", after_max <= 80, f"{after_max:.1f} MiB")]
        print()
        print("targets:")
        for name, ok, value in verdicts:
            print(f"  {'PASS' if ok else 'FAIL'}  {name}: {value}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        remove_tree(work)


if __name__ == "__main__":
    main()
