#!/usr/bin/env python3
"""Benchmark: a model from the Hugging Face Hub stand-in, cartonstore
against huggingface_hub and curl in the same run.

    python tests/bench/bench_sources.py [--size 2GiB] [--files 4] [--rounds 2] [--workdir DIR]

1. Cold download of one repository: --files safetensors shards (--size in
   all, incompressible) kept in LFS, plus config.json and tokenizer.json in
   git, from tests/kit/hub_server.py (the Hub is not reachable here: its API
   and resolve URLs on 127.0.0.1, LFS files by 302 to a CDN on another port).
   Each in a child process, fresh directory each round, alternating, the
   minimum of --rounds reported, with ratios against the fastest:
   - ``cartonstore add hf://bench/model`` (every file hashed, checked against
     its LFS sha256, fsynced, then committed);
   - ``huggingface_hub.snapshot_download`` (its 8 workers; with hf_transfer or
     hf_xet where installed, and said: the stand-in serves no Xet, so
     hf_xet is never used here);
   - ``curl --parallel -L -o`` of every resolve URL, then ``sync`` of the files.
   Target: cartonstore <= 1.0 x the fastest.
2. The same model asked by a second container of the node: a second CLI
   process ``cartonstore add hf://bench/model`` on the store the first filled.
   Figures: bytes fetched (target 0), its seconds, and the same-run seconds
   of ``cartonstore ls`` (the process's start alone) beside it; then
   ``cartonstore path`` of the model the first container built; then what a
   container does on a node with the daemon: POST /v1/leases of
   ``hf://bench/model`` (and of its hash) on the daemon's Unix socket
   (target <= 0.1 s; a CLI process alone starts in more).

Nothing is dropped from the page cache; ``sync`` runs before each timed
command so that writeback of the previous one is not charged to it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

from bench_fetch import MiB, child_run, cli_env, durably, rounds_of
from kit.hub_server import HubServer

from cartonstore.format.units import parse_size

REPO = "bench/model"


def make_shard(path: Path, size: int, uid: int) -> Path:
    """A valid safetensors file of ``size`` bytes in all: one U8 tensor of incompressible bytes."""
    header = b""
    for _ in range(2):   # the header's own length changes the tensor's
        n = size - 8 - len(header)
        header = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
        header += b" " * (-len(header) % 8)
    block = os.urandom(MiB)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        left, j = size - 8 - len(header), 0
        while left > 0:
            chunk = (struct.pack("<QQ", uid, j) + block[16:])[:left]
            f.write(chunk)
            left, j = left - len(chunk), j + 1
    return path


def cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "cartonstore.cli", *argv, "--progress", "none", "--json"]


def snapshot_cmd(endpoint: str, cache: Path) -> list[str]:
    code = (f"from huggingface_hub import snapshot_download; "
            f"snapshot_download({REPO!r}, endpoint={endpoint!r}, cache_dir={str(cache)!r})")
    return [sys.executable, "-c", code]


def accelerators() -> str:
    found = [name for name in ("hf_transfer", "hf_xet") if importlib.util.find_spec(name) is not None]
    said = f"installed: {', '.join(found)}" if found else "hf_transfer and hf_xet not installed"
    return said + ("; the stand-in serves no Xet, so plain HTTP" if "hf_xet" in found else "")


def lease_through_daemon(root: Path, env: dict[str, str], digest: str, tries: int = 20) -> None:
    """A container of the node asks the node's daemon (its Unix socket) for
    the model by its hf:// reference and by its name: POST /v1/leases, the
    revision resolved by the Hub (one listing), the carton found in the
    store, its directory leased. The median of ``tries``, each lease given
    back, after one untimed."""
    import statistics
    import time

    from kit.daemonkit import DaemonProcess

    from cartonstore.client import Client

    with DaemonProcess(root, listen=None, env=env) as daemon, Client(daemon.socket_path) as client:
        for label, model in ((f"hf://{REPO}", f"hf://{REPO}"), ("its hash", digest)):
            seconds = []
            for i in range(tries + 1):
                began = time.perf_counter()
                lease = client.acquire(model, 60.0)
                took = time.perf_counter() - began
                client.release(lease.id)
                if i:
                    seconds.append(took)
            print(f"the second container's POST /v1/leases of {label} through the daemon: median "
                  f"{statistics.median(seconds) * 1000:.1f} ms, max {max(seconds) * 1000:.1f} ms of {tries} "
                  f"(target <= 0.1 s)")


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--size", default="2GiB", help="the model's size, all shards together (e.g. 512MiB)")
    a.add_argument("--files", type=int, default=4)
    a.add_argument("--rounds", type=int, default=2)
    a.add_argument("--workdir", type=Path, default=None)
    args = a.parse_args()
    if shutil.which("curl") is None:
        raise SystemExit("needs curl")
    size = parse_size(args.size)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-sources-", dir=args.workdir))
    print(f"cores: {os.cpu_count()}  model: {size / MiB:.0f} MiB in {args.files} shards  work: {work}")
    print(f"huggingface_hub: {accelerators()}")
    try:
        shards = {f"model-{i + 1:05d}-of-{args.files:05d}.safetensors":
                  make_shard(work / f"shard-{i}", size // args.files, i) for i in range(args.files)}
        files: dict[str, bytes | Path] = {**shards, "config.json": b'{"model_type": "bench"}',
                                          "tokenizer.json": json.dumps({"vocab": list(range(5000))}).encode()}
        with HubServer() as hub:
            commit = hub.add_repo(REPO, files)
            env = {**cli_env(), "HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1",
                   "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
            urls = [f"{hub.endpoint}/{REPO}/resolve/{commit}/{path}" for path in files]
            times: dict[str, list[float]] = {"cartonstore add": [], "snapshot_download": [], "curl --parallel": []}
            for _ in range(args.rounds):
                root = work / "root"
                shutil.rmtree(root, ignore_errors=True)
                run = child_run(cli("add", f"hf://{REPO}", "--root", str(root)), env=env)
                if not json.loads(run.stdout)["complete"]:
                    raise SystemExit("the add left the carton incomplete")
                times["cartonstore add"].append(run.seconds)
                shutil.rmtree(work / "hf-cache", ignore_errors=True)
                times["snapshot_download"].append(child_run(snapshot_cmd(hub.endpoint, work / "hf-cache"),
                                                            env=env).seconds)
                out = work / "curl"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                outs = [out / f"f{i}" for i in range(len(urls))]
                cmd = ["curl", "--parallel", "--parallel-max", "8", "-sS", "--no-progress-meter", "--fail", "-L",
                       "--noproxy", "*"]
                for url, path in zip(urls, outs, strict=True):
                    cmd += ["-o", str(path), url]
                times["curl --parallel"].append(child_run(durably(cmd, outs), env=env).seconds)
            fastest = min(min(xs) for xs in times.values())
            print("\n== cold download ==")
            for what, xs in times.items():
                print(f"{what:18} {rounds_of(xs)} s  best {min(xs):.2f} s  {size / MiB / min(xs):.0f} MiB/s  "
                      f"{min(xs) / fastest:.2f} x the fastest")
            ratio = min(times["cartonstore add"]) / fastest
            print(f"cartonstore: {ratio:.2f} x the fastest (target <= 1.0: {'met' if ratio <= 1.0 else 'NOT met'})")

            print("\n== the same model asked by a second container (a second CLI process, same store) ==")
            second = child_run(cli("add", f"hf://{REPO}", "--root", str(work / "root")), env=env)
            said = json.loads(second.stdout)
            start = child_run([sys.executable, "-m", "cartonstore.cli", "ls", "--root", str(work / "root")], env=env)
            print(f"bytes fetched: {said['bytes_received']} (target 0), blobs fetched: {said['blobs_fetched']}, "
                  f"requests: {said['requests']} (the revision's listing is asked once besides)")
            print(f"seconds: {second.seconds:.3f} (target <= 0.1); the same run's `cartonstore ls` "
                  f"(process start alone): {start.seconds:.3f}, so {second.seconds - start.seconds:.3f} s for the add")
            digest = said["manifest_sha256"]
            path = [sys.executable, "-m", "cartonstore.cli", "path", digest, "--root", str(work / "root")]
            child_run(path, env=env)   # the first container materializes it
            again = child_run(path, env=env)
            print(f"the second container's `cartonstore path {digest[:12]}` (nothing fetched, the model built): "
                  f"{again.seconds:.3f} s")
            lease_through_daemon(work / "root", env, digest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
