#!/usr/bin/env python3
"""Benchmark: what the origin serves to a fleet of 3 nodes, with and
without peers (issue 12 §4), in the same run.

    python tests/bench/bench_peers.py [--size-mib 1024] [--files 4] [--workdir DIR]

One carton of --files incompressible files (--size-mib in all), packed
Stored, served by the bench origin (fetch_origin.py: sendfile, counting
every body byte it sends). Three daemons on loopback ports lease it at the
same moment, each into a fresh store:

1. Baseline: no peers. Each node reads the carton's zip from the origin.
2. Peers: each node lists the other two ([peers], with a token). The node
   whose id ranks highest for a blob fetches it from the origin, the others
   wait on it and take it from that peer.

Printed: origin bytes of each against 3 x the carton's size (target: the
peered fleet's origin bytes <= 1 x the carton + the zips' directories, i.e.
well under 3 x), bytes each node took from peers (/metrics), and the wall
time until all three hold the model. Every blob is verified by hash as it
is written, on every node.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

from bench_fetch import BlobMaker, MiB, carton_dir, pack
from fetch_origin import Origin as OriginProcess
from kit.peerkit import fleet, metric

from cartonstore.client.leases import Client


def lease_everywhere(nodes, url: str) -> float:
    """Lease url on every node at once; seconds until the last one holds it."""
    errors: list[BaseException] = []

    def one(node) -> None:
        try:
            Client(node.socket_path, timeout=600).acquire(url, ttl=3600)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in nodes]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"a lease failed: {errors[0]}")
    return time.perf_counter() - started


def run(work: Path, origin: OriginProcess, url: str, label: str, peers: bool) -> dict:
    origin.reset()
    base = Path(tempfile.mkdtemp(prefix="bp-", dir="/tmp"))   # short: Unix socket paths
    with fleet(base, 3, peers_of=None if peers else (lambda i, urls: [])) as nodes:
        seconds = lease_everywhere(nodes, url)
        from_peers = [metric(n, "cartonstore_fetched_source_bytes_total", 'source="peer"') for n in nodes]
    served = origin.stats()["bytes_sent"]
    import shutil

    shutil.rmtree(base, ignore_errors=True)
    return {"label": label, "seconds": seconds, "origin_bytes": served, "from_peers": from_peers}


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--size-mib", type=int, default=1024)
    a.add_argument("--files", type=int, default=4)
    a.add_argument("--workdir", type=Path, default=None)
    args = a.parse_args()
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-peers-", dir=args.workdir))
    maker = BlobMaker()
    blobs = [maker.make(work / "blobs", args.size_mib // args.files) for _ in range(args.files)]
    (work / "origin").mkdir()
    carton = pack(carton_dir(work, "fleet", blobs), work / "origin" / "fleet.carton", compression="stored")
    size = carton.stat().st_size
    print(f"cores: {os.cpu_count()}  carton: {size / MiB:.1f} MiB in {args.files} files  work: {work}")
    origin = OriginProcess(work / "origin")
    try:
        url = origin.url("/fleet.carton")
        results = [run(work, origin, url, "no peers (baseline)", False), run(work, origin, url, "peers", True)]
    finally:
        origin.stop()
    print(f"\n{'':22} {'origin bytes':>14} {'x carton':>9} {'from peers (per node, MiB)':>30} {'wall s':>8}")
    for r in results:
        peers = ", ".join(f"{b / MiB:.0f}" for b in r["from_peers"])
        print(f"{r['label']:22} {r['origin_bytes'] / MiB:11.1f} MiB {r['origin_bytes'] / size:9.2f} {peers:>30} "
              f"{r['seconds']:8.2f}")
    base, peered = results
    print(f"\norigin bytes, peers vs 3 x carton: {peered['origin_bytes'] / (3 * size):.2f} "
          f"(target: about 1/3); vs the no-peer fleet in this run: {peered['origin_bytes'] / base['origin_bytes']:.2f}")
    print(f"wall time, peers / no peers: {peered['seconds'] / base['seconds']:.2f}")
    import shutil

    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
