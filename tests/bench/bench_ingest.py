#!/usr/bin/env python3
"""Benchmark: ingest of a local 2 GiB carton (Stored entries) vs unzip + sha256sum.

Target (issue 2): cartonstore add runs at >= 0.8x the speed of `unzip` of the
same file plus `sha256sum` of what it extracted, measured in the same run;
peak RSS of the add process under 150 MiB.

    python tests/bench/bench_ingest.py [--size-mib 2048] [--files 4] [--workdir DIR]

Both sides read the carton from the page cache (it is read once first);
both write to the same filesystem. cartonstore additionally fsyncs each
blob (durability the baseline does not pay for).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))

from cartonstore.pack import pack_directory  # noqa: E402
from cartonstore.store.materialize import remove_tree  # noqa: E402


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


def child_run(cmd: list[str], **kw) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one child process."""
    t0 = time.perf_counter()
    pid = subprocess.Popen(cmd, **kw).pid
    _, status, usage = os.wait4(pid, 0)
    dt = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{cmd[0]} failed with status {status}")
    return dt, usage.ru_maxrss


def baseline(carton: Path, work: Path) -> tuple[float, float]:
    """(unzip seconds, sha256sum seconds)."""
    out = work / "unzipped"
    t_unzip, _ = child_run(["unzip", "-q", "-o", str(carton), "-d", str(out)])
    files = [str(p) for p in out.rglob("*") if p.is_file()]
    t_hash, _ = child_run(["sha256sum", *files], stdout=subprocess.DEVNULL)
    shutil.rmtree(out)
    return t_unzip, t_hash


def ours(carton: Path, work: Path) -> tuple[float, int]:
    root = work / "root"
    remove_tree(root)
    cmd = [sys.executable, "-m", "cartonstore.cli", "add", str(carton), "--root", str(root)]
    return child_run(cmd, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(HERE.parents[2])})


def main() -> None:
    ap = argparse.ArgumentParser()
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
        base, mine, rss, parts = [], [], [], []
        for _ in range(a.rounds):
            parts.append(baseline(carton, work))
            base.append(sum(parts[-1]))
            t, r = ours(carton, work)
            mine.append(t)
            rss.append(r)
        b, m = min(base), min(mine)
        mib = carton.stat().st_size / (1 << 20)
        print(f"carton: {mib:.0f} MiB in {a.files} stored entries")
        print(f"baseline unzip+sha256sum: {b:.2f} s ({mib / b:.0f} MiB/s)   rounds: {[round(x, 2) for x in base]}")
        print(f"  of which unzip / sha256sum: {[(round(u, 2), round(h, 2)) for u, h in parts]}")
        print(f"cartonstore add:          {m:.2f} s ({mib / m:.0f} MiB/s)   rounds: {[round(x, 2) for x in mine]}")
        print(f"speed ratio (ours/baseline, target >= 0.8): {b / m:.2f}")
        print(f"peak RSS of add: {max(rss) / 1024:.0f} MiB (target < 150 MiB)")
    finally:
        remove_tree(work)


if __name__ == "__main__":
    main()
