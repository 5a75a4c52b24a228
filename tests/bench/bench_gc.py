#!/usr/bin/env python3
"""Benchmark: gc over a store of 100,000 blobs and 10,000 cartons.

Target (issue 5): `cartonstore gc` finishes in <= 10 s with <= 200 MiB RSS;
lease and load latency stay within the daemon's targets while gc runs, both
when the daemon runs the collection (`cartonstore gc` with a daemon serving)
and when `cartonstore gc --local` runs beside it.

The store is populated synthetically (real blob files named by their hash,
rows written straight into the index) so setup takes seconds, not hours:
10,000 cartons of 10 blobs each (9 of their own + 1 shared by 100 cartons),
1,000 of them materialized, 10% more blobs unreferenced, and a budget that
forces the eviction of about a quarter of the bytes. Baseline in the same
run: `find ROOT/blobs -type f | wc -l` (one walk of the blob tree).

    python tests/bench/bench_gc.py [--cartons 10000] [--per-carton 10] [--via daemon|local|both]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parents[1]))

from bench_daemon import rss_mib  # this script's directory is on sys.path

from cartonstore.store import Store
from cartonstore.store.materialize.tree import remove_tree

TOML = b'spec_version = 1\nmodel_name = "m"\n[runner]\nrunner_name = "x"\nrequired_framework_version = "1"\n'


def blob(store: Store, data: bytes) -> tuple[str, int]:
    d = hashlib.sha256(data).hexdigest()
    p = store.blobs.path(d)
    p.parent.mkdir(parents=True, exist_ok=True)
    if not p.exists():
        p.write_bytes(data)
        os.chmod(p, 0o444)
    return d, len(data)


def populate(root: Path, cartons: int, per: int) -> tuple[Store, int]:
    store = Store(root)
    now = time.time()
    toml_digest, toml_size = blob(store, TOML)
    shared = [blob(store, f"shared {i}".encode() * 50) for i in range(cartons // 100 + 1)]
    rows_blobs, rows_cartons, rows_entries = [(toml_digest, toml_size, now - 7200)], [], []
    rows_blobs += [(d, s, now - 7200) for d, s in shared]
    for c in range(cartons):
        files = {"carton.toml": (toml_digest, toml_size), "model/shared.bin": shared[c // 100]}
        for i in range(per - 2):
            files[f"model/f{i}.bin"] = blob(store, f"carton {c} file {i} ".encode() * 40)
        manifest = "".join(f"{p}={d}\n" for p, (d, _) in sorted(files.items())).encode()
        md, ms = blob(store, manifest)
        rows_blobs += [(d, s, now - 7200) for p, (d, s) in files.items() if p.startswith("model/f")] + [(md, ms, now - 7200)]
        rows_cartons.append((md, f"m{c}", "x", len(files), sum(s for _, s in files.values()), None, now - 7200,
                             now - 7200 + c))
        rows_entries += [(md, p, d, s, "file", None) for p, (d, s) in files.items()]
    for i in range(len(rows_cartons) * per // 10):  # 10% unreferenced
        d, s = blob(store, f"orphan {i} ".encode() * 40)
        rows_blobs.append((d, s, now - 7200))
    conn = sqlite3.connect(root / "index.db")
    with conn:
        conn.executemany("INSERT OR IGNORE INTO blobs VALUES (?,?,?)", rows_blobs)
        conn.executemany("INSERT INTO cartons VALUES (?,?,?,?,?,?,?,?)", rows_cartons)
        conn.executemany("INSERT INTO entries VALUES (?,?,?,?,?,?)", rows_entries)
    conn.close()
    for digest, *_ in rows_cartons[-(cartons // 10):]:
        store.materialize(digest)
    return store, len(rows_blobs)


def child(cmd: list[str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    if status:
        raise SystemExit(f"{cmd} failed: {status}")
    return time.perf_counter() - t0, usage.ru_maxrss, out


async def lease_latencies(sock: Path, stop: asyncio.Event) -> list[float]:
    """One loader taking and releasing leases back to back: ms per request."""
    from kit.daemonkit import unix_session

    out = []
    async with unix_session(sock) as s:
        while not stop.is_set():
            t0 = time.perf_counter()
            async with s.post("/v1/leases", json={"model": "fx", "ttl": 30}) as r:
                lease = (await r.json())["lease"]
            async with s.delete(f"/v1/leases/{lease}") as r:
                await r.read()
            out.append((time.perf_counter() - t0) * 1000 / 2)
    return out


async def load_latencies(sock: Path, stop: asyncio.Event) -> list[float]:
    """One Triton client loading a cached model (a pin) and unloading it: ms
    per request."""
    from kit.daemonkit import unix_session

    out = []
    async with unix_session(sock) as s:
        while not stop.is_set():
            t0 = time.perf_counter()
            async with s.post("/v2/repository/models/fx/load") as r:
                assert r.status == 200, await r.text()
            async with s.post("/v2/repository/models/fx/unload") as r:
                await r.read()
            out.append((time.perf_counter() - t0) * 1000 / 2)
    return out


def q(xs: list[float], p: float) -> float:
    return statistics.quantiles(xs, n=100)[int(p) - 1] if len(xs) > 1 else float("nan")


def latency_line(label: str, xs: list[float]) -> str:
    return f"  {label:<34} p50 {q(xs, 50):5.2f} ms  p99 {q(xs, 99):5.2f} ms  max {max(xs):5.1f} ms  ({len(xs)} samples)"


def run(work: Path, a: argparse.Namespace, via: str) -> None:
    """Populate a store, start a daemon on it, and collect ``via`` the daemon
    (`cartonstore gc`, what cron runs when a daemon serves) or ``--local``
    while one loader takes leases and another loads models."""
    root = work / via
    t0 = time.perf_counter()
    store, nblobs = populate(root, a.cartons, a.per_carton)
    stored = store.index.stored_bytes()
    store.close()
    fixture = HERE.parents[1] / "fixtures" / "carton-repo-test.carton"
    subprocess.run([sys.executable, "-m", "cartonstore.cli", "add", str(fixture), "--name", "fx", "--root",
                    str(root), "--progress", "none"], check=True, stdout=subprocess.DEVNULL)
    print(f"\n== gc {'through the daemon' if via == 'daemon' else '--local, beside the daemon'} ==")
    print(f"store: {nblobs} blobs, {a.cartons} cartons, {a.cartons // 10} materialized, "
          f"{stored / 2**20:.1f} MiB; built in {time.perf_counter() - t0:.1f} s")
    walk, _, _ = child(["bash", "-c", f"find {root}/blobs -type f | wc -l"])
    print(f"baseline: find over blobs/: {walk:.2f} s")
    sock = root / "cartonstore.sock"
    cmd = [sys.executable, "-m", "cartonstore.cli", "gc", "--root", str(root), "--json", "--socket", str(sock),
           "--max-size", str(int(stored * 0.75))] + (["--local"] if via == "local" else [])
    if via == "local":
        dry, rss_dry, _ = child([*cmd, "--dry-run"])
        print(f"gc --dry-run: {dry:.2f} s, peak RSS {rss_dry / 1024:.0f} MiB")

    from kit.daemonkit import DaemonProcess

    with DaemonProcess(root, listen=None, socket_path=sock) as d:
        async def loaders(gc_cmd: list[str] | None) -> tuple[list[float], list[float], object]:
            stop = asyncio.Event()
            tasks = [asyncio.ensure_future(f(sock, stop)) for f in (lease_latencies, load_latencies)]
            if gc_cmd is None:
                await asyncio.sleep(3)
                result = None
            else:
                result = await asyncio.to_thread(child, gc_cmd)
            stop.set()
            leases, loads = await asyncio.gather(*tasks)
            return leases, loads, result

        idle_leases, idle_loads, _ = asyncio.run(loaders(None))
        rss_before = rss_mib(d.proc.pid)
        busy_leases, busy_loads, (secs, rss, out) = asyncio.run(loaders(cmd))
        rss_after = rss_mib(d.proc.pid)
    report = json.loads(out)
    print(f"gc: {secs:.2f} s (target <= 10 s) ran in {report['ran_in']}; {secs / walk:.1f}x the find baseline")
    if via == "local":
        print(f"  peak RSS of gc: {rss / 1024:.0f} MiB (target <= 200 MiB)")
    print(f"  daemon RSS: {rss_before:.0f} MiB before, {rss_after:.0f} MiB after")
    print(f"  freed {report['freed_bytes'] / 2**20:.1f} MiB: {report['unreferenced_blobs']} unreferenced blobs, "
          f"{len(report['evicted_models'])} models and {report['evicted_blobs']} blobs evicted")
    print("latency per request, one lease client and one load client at once (targets p50 <= 1, p99 <= 5):")
    print(latency_line("lease or release, idle:", idle_leases))
    print(latency_line("lease or release, while gc runs:", busy_leases))
    print(latency_line("load or unload, idle:", idle_loads))
    print(latency_line("load or unload, while gc runs:", busy_loads))
    with Store(root) as s:
        v = s.verify()
        print(f"verify after gc: {'ok' if v.ok else 'FAILED'} ({v.blobs_checked} blobs)")
        if not v.ok:
            raise SystemExit("verify failed")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cartons", type=int, default=10_000)
    ap.add_argument("--per-carton", type=int, default=10)
    ap.add_argument("--via", choices=["daemon", "local", "both"], default="both")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cs-bench-gc-"))
    try:
        for via in (["daemon", "local"] if a.via == "both" else [a.via]):
            run(work, a, via)
    finally:
        remove_tree(work)


if __name__ == "__main__":
    main()
