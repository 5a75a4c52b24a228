#!/usr/bin/env python3
"""Benchmark: `cartonstore add` of a local 2 GiB carton (Stored entries),
against the shell doing the same work, in the same run.

    python tests/bench/bench_ingest.py [--size-mib 2048] [--files 4] [--rounds 2] [--workdir DIR]

Baselines, each timed as one child process tree (wall seconds and the CPU of
every process in it):

- ``unzip -q`` of the carton, then ``openssl dgst -sha256`` of the files it
  extracted (openssl uses the CPU's SHA extensions where it has them;
  coreutils' sha256sum may not, so it is not the baseline).
- ``cp`` of the carton's bytes, then ``openssl dgst -sha256`` of the copy.
- The same, then ``sync`` of the copy (shown, not a target): the baseline
  that, like the add, ends when the bytes are on disk.

Targets (the data-path issue): add >= 1.0x the speed of unzip + openssl and
>= 0.8x the speed of cp + openssl; <= 1.5 CPU-seconds per GiB ingested;
peak RSS of the add under 150 MiB.

The carton is read once first, so every side reads it from the page cache;
all write to the same filesystem; ``sync`` runs before each timed command so
that writeback of the previous one is not charged to it. cartonstore also
fsyncs each blob, durability neither baseline pays for.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))

from cartonstore.carton.pack import pack_directory
from cartonstore.store.materialize.tree import remove_tree

GiB = 1 << 30


@dataclass
class Run:
    seconds: float
    cpu: float       # user + system of the child and everything it waited for
    rss_kib: int


def make_carton(work: Path, size_mib: int, files: int) -> Path:
    src = work / "src"
    (src / "model").mkdir(parents=True)
    (src / "carton.toml").write_text('spec_version = 1\nmodel_name = "bench"\n[runner]\n'
                                     'runner_name = "x"\nrequired_framework_version = "1"\n')
    per = size_mib // files
    block = os.urandom(1 << 20)
    for i in range(files):
        with open(src / "model" / f"part{i}.bin", "wb") as f:
            for j in range(per):
                f.write(bytes([i & 0xFF, j & 0xFF]) + block[2:])  # distinct, incompressible
    out = work / "bench.carton"
    pack_directory(src, out, compression="stored")
    shutil.rmtree(src)
    return out


def child_run(cmd: list[str], **kw) -> Run:
    os.sync()
    t0 = time.perf_counter()
    pid = subprocess.Popen(cmd, **kw).pid
    _, status, usage = os.wait4(pid, 0)
    dt = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{cmd[:3]} failed with status {status}")
    return Run(dt, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)


def unzip_openssl(carton: Path, work: Path) -> Run:
    out = work / "unzipped"
    script = (f"unzip -q -o {carton} -d {out} && find {out} -type f -print0 "
              f"| xargs -0 openssl dgst -sha256 > /dev/null")
    try:
        return child_run(["bash", "-o", "pipefail", "-c", script])
    finally:
        shutil.rmtree(out, ignore_errors=True)


def cp_openssl(carton: Path, work: Path) -> Run:
    copy = work / "copy.carton"
    try:
        return child_run(["bash", "-c", f"cp {carton} {copy} && openssl dgst -sha256 {copy} > /dev/null"])
    finally:
        copy.unlink(missing_ok=True)


def cp_openssl_sync(carton: Path, work: Path) -> Run:
    """cp + openssl, then an fsync of the copy: like the add, done when the bytes are on disk."""
    copy = work / "copy.carton"
    try:
        return child_run(["bash", "-c", f"cp {carton} {copy} && openssl dgst -sha256 {copy} > /dev/null "
                                        f"&& sync {copy}"])
    finally:
        copy.unlink(missing_ok=True)


def disk_floor(carton: Path, work: Path) -> Run:
    """The carton's size of zeros written and fsynced: what the disk alone
    takes to make these bytes durable, which an add must (a blob is visible
    only once fsynced). A filesystem that shares blocks (XFS, btrfs) lets the
    add and cp skip the writing, so there the floor says less."""
    out = work / "zeros"
    try:
        return child_run(["dd", "if=/dev/zero", f"of={out}", "bs=1M", f"count={-(-carton.stat().st_size // (1 << 20))}",
                          "conv=fsync", "status=none"])
    finally:
        out.unlink(missing_ok=True)


def ours(carton: Path, work: Path) -> Run:
    root = work / "root"
    remove_tree(root)
    cmd = [sys.executable, "-m", "cartonstore.cli", "add", str(carton), "--root", str(root)]
    return child_run(cmd, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(HERE.parents[2])})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    if a.workdir:  # a --workdir that does not exist yet is created
        Path(a.workdir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cs-bench-", dir=a.workdir))
    try:
        carton = make_carton(work, a.size_mib, a.files)
        subprocess.run(["cat", str(carton)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
        runs: dict[str, list[Run]] = {"unzip + openssl": [], "cp + openssl": [], "cp + openssl; sync": [],
                                      "disk floor (dd fsync)": [], "cartonstore add": []}
        for _ in range(a.rounds):
            runs["unzip + openssl"].append(unzip_openssl(carton, work))
            runs["cp + openssl"].append(cp_openssl(carton, work))
            runs["cp + openssl; sync"].append(cp_openssl_sync(carton, work))
            runs["disk floor (dd fsync)"].append(disk_floor(carton, work))
            runs["cartonstore add"].append(ours(carton, work))
        size = carton.stat().st_size
        print(f"{len(os.sched_getaffinity(0))} cores; carton: {size / (1 << 20):.0f} MiB in {a.files} stored entries")
        best = {k: min(r.seconds for r in v) for k, v in runs.items()}
        for k, v in runs.items():
            cpu = min(r.cpu for r in v) / (size / GiB)
            print(f"{k:21} {best[k]:.2f} s ({size / (1 << 20) / best[k]:.0f} MiB/s)  "
                  f"rounds: {[round(r.seconds, 2) for r in v]}  CPU-s per GiB: {cpu:.2f}")
        m = best["cartonstore add"]
        cpu = min(r.cpu for r in runs["cartonstore add"]) / (size / GiB)
        rss = max(r.rss_kib for r in runs["cartonstore add"]) / 1024
        rows = [("speed vs unzip + openssl", best["unzip + openssl"] / m, ">= 1.0", best["unzip + openssl"] / m >= 1.0),
                ("speed vs cp + openssl", best["cp + openssl"] / m, ">= 0.8", best["cp + openssl"] / m >= 0.8),
                ("speed vs cp+openssl; sync", best["cp + openssl; sync"] / m, "", None),
                ("disk floor vs cp + openssl", best["cp + openssl"] / best["disk floor (dd fsync)"], "", None),
                ("speed vs disk floor", best["disk floor (dd fsync)"] / m, "", None),
                ("CPU-s per GiB ingested", cpu, "<= 1.5", cpu <= 1.5),
                ("peak RSS of add, MiB", rss, "< 150", rss < 150)]
        print("\n== summary ==")
        for what, value, target, ok in rows:
            verdict = "" if ok is None else ("PASS" if ok else "FAIL")
            print(f"{what:26} {value:8.2f}  {'target ' + target if target else '(reference)':14} {verdict}")
    finally:
        remove_tree(work)


if __name__ == "__main__":
    main()
