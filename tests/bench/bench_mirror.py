#!/usr/bin/env python3
"""Benchmark: the node's registry mirror against skopeo pulling from the
upstream registry directly, in the same run.

    python tests/bench/bench_mirror.py [--size 1GiB] [--layers 1] [--rounds 3] [--workdir DIR]

An artifact of --size incompressible bytes (in --layers layers) is pushed
to a docker-registry on 127.0.0.1 (the upstream). Each round, alternating:

1. direct: ``skopeo copy docker://UPSTREAM/... oci:DIR``.
2. pull-through: the same copy from a daemon's mirror (``serve
   --mirror-listen``, mirror.upstream = the registry) on a fresh store:
   every blob fetched from upstream, verified and stored while streamed.
   Target: <= 1.2 x direct.
3. held: the same copy from that mirror again, the node holding every
   blob (served from the store). Target: <= 0.5 x direct.

The minimum of each is compared. skopeo checks every blob's digest in
each case and writes it to disk, which on a small machine is most of its
time; so the servers alone are also compared: ``curl -o /dev/null`` of
every blob from the upstream registry and from the mirror holding it.
skopeo nothing is dropped from the page cache, and ``sync`` runs
before each timed command (bench_fetch.child_run).
"""

from __future__ import annotations

import argparse
import hashlib
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

from bench_fetch import MiB, child_run, rounds_of
from kit.daemonkit import DaemonProcess
from kit.registrykit import BINARY, Registry, free_port

from cartonstore.format.units import parse_size

LAYER = "application/vnd.oci.image.layer.v1.tar"


def push_artifact(registry: Registry, repo: str, size: int, layers: int) -> list[str]:
    """``layers`` incompressible layers of ``size`` bytes in all, and an
    empty config; returns the layers' digests."""
    descriptors = []
    for i in range(layers):
        data = os.urandom(size // layers)
        descriptors.append({"mediaType": LAYER, "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
                            "size": len(data), "annotations": {"org.opencontainers.image.title": f"part-{i}"}})
        registry.put_blob(repo, data)
        del data
    registry.put_blob(repo, b"{}")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "artifactType": "application/vnd.example.bench.v1",
                "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                           "digest": "sha256:" + hashlib.sha256(b"{}").hexdigest(), "size": 2},
                "layers": descriptors}
    registry.put_manifest(repo, "v1", json.dumps(manifest).encode())
    return [d["digest"] for d in descriptors]


def copy(skopeo: str, source: str, dest: Path) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    return child_run([skopeo, "copy", "-q", "--src-tls-verify=false", f"docker://{source}", f"oci:{dest}"]).seconds


def curl_blobs(curl: str, authority: str, repo: str, digests: list[str]) -> float:
    return child_run([curl, "-sSf", "--no-progress-meter", "--parallel", *(arg for d in digests for arg in
                      (f"http://{authority}/v2/{repo}/blobs/{d}", "-o", "/dev/null"))]).seconds


def verdict(ratio: float, target: float) -> str:
    return f"{ratio:.2f} x direct (target <= {target}: {'met' if ratio <= target else 'NOT met'})"


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--size", default="1GiB", help="the artifact's size, all layers together (e.g. 256MiB)")
    a.add_argument("--layers", type=int, default=1)
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--workdir", type=Path, default=None)
    args = a.parse_args()
    size = parse_size(args.size)
    skopeo, curl = shutil.which("skopeo"), shutil.which("curl")
    if BINARY is None or skopeo is None or curl is None:
        raise SystemExit("needs docker-registry, skopeo and curl (Debian packages of those names)")
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-mirror-", dir=args.workdir))
    os.environ["DOCKER_CONFIG"] = str(work / "docker")
    print(f"cores: {os.cpu_count()}  artifact: {size / MiB:.0f} MiB in {args.layers} layer(s)  work: {work}")
    try:
        with Registry(work / "registry") as registry:
            layers = push_artifact(registry, "bench/m", size, args.layers)
            config = work / "config.toml"
            config.write_text(f'[mirror]\nupstream = "{registry.authority}"\n')
            direct, through, held, curl_upstream, curl_held = [], [], [], [], []
            for n in range(args.rounds):
                direct.append(copy(skopeo, f"{registry.authority}/bench/m:v1", work / "out"))
                port = free_port()
                node = DaemonProcess(work / f"node-{n}", env={"CARTONSTORE_CONFIG": ""},
                                     extra_args=["--mirror-listen", f"127.0.0.1:{port}", "--config", str(config)],
                                     log_file=work / f"node-{n}.log")
                with node:
                    through.append(copy(skopeo, f"127.0.0.1:{port}/bench/m:v1", work / "out"))
                    held.append(copy(skopeo, f"127.0.0.1:{port}/bench/m:v1", work / "out"))
                    curl_held.append(curl_blobs(curl, f"127.0.0.1:{port}", "bench/m", layers))
                curl_upstream.append(curl_blobs(curl, registry.authority, "bench/m", layers))
                shutil.rmtree(work / f"node-{n}", ignore_errors=True)
            gib = size / (1 << 30)
            for name, runs in (("direct skopeo copy", direct), ("pull-through (first)", through),
                               ("held by the node", held), ("curl from upstream", curl_upstream),
                               ("curl from the node", curl_held)):
                print(f"{name:22s} {rounds_of(runs)} s  best {gib / min(runs):.2f} GiB/s")
            print(f"pull-through: {verdict(min(through) / min(direct), 1.2)}")
            print(f"held:         {verdict(min(held) / min(direct), 0.5)}")
            print(f"servers alone (curl): the node {min(curl_held) / min(curl_upstream):.2f} x upstream")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
