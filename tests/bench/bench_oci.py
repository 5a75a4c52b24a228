#!/usr/bin/env python3
"""Benchmark: cartons through a real OCI registry (issue 12 §4), against
skopeo in the same run.

    python tests/bench/bench_oci.py [--size-mib 2048] [--files 8] [--rounds 2] [--workdir DIR]

1. Push: a carton of --files incompressible files (--size-mib in all) from
   a store into a fresh docker-registry on 127.0.0.1 (timed, for reference).
2. Pull: ``cartonstore add oci://...`` into a fresh root (a child process;
   every blob hashed, checked against its digest and size, fsynced) against
   ``skopeo copy docker://... dir:DIR`` of the same artifact (skopeo checks
   every blob's digest too). They alternate, --rounds rounds; the minimum of
   each is compared. Target: ours <= 1.0 x skopeo.
3. Dedup on push: a second carton sharing 90% of its bytes (all files but
   one, plus a new one of 1/9 of the shared bytes) pushed to the same
   repository. Target: bytes uploaded <= 10% of its bytes + 1 MiB.

The registry serves from its filesystem driver on the same disk; nothing is
dropped from the page cache. ``sync`` runs before each timed command.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

from bench_fetch import BlobMaker, MiB, carton_dir, child_run, cli_env, rounds_of
from kit.registrykit import BINARY, Registry


def cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "cartonstore.cli", *argv, "--progress", "none", "--json"]


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--size-mib", type=int, default=2048)
    a.add_argument("--files", type=int, default=8)
    a.add_argument("--rounds", type=int, default=2)
    a.add_argument("--workdir", type=Path, default=None)
    args = a.parse_args()
    skopeo = shutil.which("skopeo")
    if BINARY is None or skopeo is None:
        raise SystemExit("needs docker-registry and skopeo (Debian packages docker-registry, skopeo)")
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-oci-", dir=args.workdir))
    env = {**cli_env(), "DOCKER_CONFIG": str(work / "docker")}
    print(f"cores: {os.cpu_count()}  carton: {args.size_mib} MiB in {args.files} files  work: {work}")
    try:
        maker = BlobMaker()
        per = args.size_mib // args.files
        blobs = [maker.make(work / "blobs", per) for _ in range(args.files)]
        with Registry(work / "registry") as registry:
            src_root = work / "src-root"
            child_run(cli("add", str(carton_dir(work, "a", blobs)), "--root", str(src_root), "--name", "a"), env=env)
            ref = registry.ref("bench/a:v1")
            push = child_run(cli("push", "a", ref, "--root", str(src_root)), env=env)
            print(f"push of {args.size_mib} MiB: {push.seconds:.2f} s ({json.loads(push.stdout)['uploaded']} blobs)")

            ours, theirs = [], []
            for _ in range(args.rounds):
                shutil.rmtree(work / "dst-root", ignore_errors=True)
                run = child_run(cli("add", ref, "--root", str(work / "dst-root")), env=env)
                if not json.loads(run.stdout)["complete"]:
                    raise SystemExit("the pull left the carton incomplete")
                ours.append(run)
                shutil.rmtree(work / "skopeo-dir", ignore_errors=True)
                theirs.append(child_run([skopeo, "copy", "-q", "--src-tls-verify=false",
                                         f"docker://{registry.authority}/bench/a:v1", f"dir:{work / 'skopeo-dir'}"],
                                        env=env))
            best_ours = min(r.seconds for r in ours)
            best_theirs = min(r.seconds for r in theirs)
            gib = args.size_mib / 1024
            print(f"pull  cartonstore add: {rounds_of([r.seconds for r in ours])} s  "
                  f"CPU {min(r.cpu for r in ours) / gib:.2f} s/GiB  RSS {max(r.rss_kib for r in ours) // 1024} MiB")
            print(f"pull  skopeo copy:     {rounds_of([r.seconds for r in theirs])} s")
            ratio = best_ours / best_theirs
            print(f"pull ratio: {ratio:.2f} x skopeo (target <= 1.0: {'met' if ratio <= 1.0 else 'NOT met'})")

            new = maker.make(work / "blobs", max(1, args.size_mib // 9))
            child_run(cli("add", str(carton_dir(work, "b", [*blobs, new])), "--root", str(src_root), "--name", "b"),
                      env=env)
            second = json.loads(child_run(cli("push", "b", registry.ref("bench/b:v1"), "--root", str(src_root)),
                                          env=env).stdout)
            total = (args.files * per + max(1, args.size_mib // 9)) * MiB
            limit = total // 10 + MiB
            print(f"dedup push: {second['bytes_uploaded'] / MiB:.1f} MiB uploaded of {total / MiB:.0f} MiB "
                  f"(limit 10% + 1 MiB = {limit / MiB:.1f} MiB: "
                  f"{'met' if second['bytes_uploaded'] <= limit else 'NOT met'}); "
                  f"{second['mounted']} blobs mounted from bench/a, {second['present']} already there")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
