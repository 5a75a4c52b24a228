#!/usr/bin/env python3
"""Benchmark: materializing cartons whose blobs are present.

Targets (issue 2): 10,000 small files in under 2 s; one 2 GiB file in under
100 ms (hardlinks, no data copied). Baseline in the same run: `cp -r` of the
same 10,000 files, and `cp` of the 2 GiB file.

    python tests/bench/bench_materialize.py [--files 10000] [--big-mib 2048]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))

from cartonstore.store import Store
from cartonstore.store.materialize.tree import remove_tree

TOML = b'spec_version = 1\nmodel_name = "m"\n[runner]\nrunner_name = "x"\nrequired_framework_version = "1"\n'


def small_dir(work: Path, n: int) -> Path:
    src = work / "small"
    for i in range(n):
        d = src / "model" / f"d{i // 500:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.txt").write_bytes(f"file {i}\n".encode() * 8)
    (src / "carton.toml").write_bytes(TOML)
    return src


def big_dir(work: Path, mib: int) -> Path:
    src = work / "big"
    (src / "model").mkdir(parents=True)
    (src / "carton.toml").write_bytes(TOML.replace(b'"m"', b'"big"'))
    block = os.urandom(1 << 20)
    with open(src / "model" / "weights.bin", "wb") as f:
        for _ in range(mib):
            f.write(block)
    return src


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--big-mib", type=int, default=2048)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cs-bench-mat-"))
    try:
        with Store(work / "root") as store:
            small = small_dir(work, a.files)
            d_small = store.add(small).digest
            t_small = timed(lambda: store.materialize(d_small))
            t_cp_small = timed(lambda: subprocess.run(["cp", "-r", str(small), str(work / "cp-small")], check=True))
            t_again = timed(lambda: store.materialize(d_small))
            big = big_dir(work, a.big_mib)
            d_big = store.add(big).digest
            t_big = timed(lambda: store.materialize(d_big))
            t_cp_big = timed(lambda: subprocess.run(["cp", str(big / "model" / "weights.bin"), str(work / "cp-big")],
                                                    check=True))
        print(f"{a.files} small files: materialize {t_small * 1000:.0f} ms (target < 2000 ms); "
              f"cp -r baseline {t_cp_small * 1000:.0f} ms; ratio {t_small / t_cp_small:.2f}x of cp")
        print(f"second call (already materialized): {t_again * 1000:.2f} ms")
        print(f"one {a.big_mib} MiB file: materialize {t_big * 1000:.1f} ms (target < 100 ms); "
              f"cp baseline {t_cp_big * 1000:.0f} ms")
    finally:
        remove_tree(work)


if __name__ == "__main__":
    main()
