#!/usr/bin/env python3
"""Benchmark: fetching cartons over HTTP, against curl (and zstd) in the same run.

    python tests/bench/bench_fetch.py [--size-mib 2048] [--files 8] [--rounds 2]
                                      [--procs 50] [--small-files 8] [--small-mib 8]
                                      [--phases 1,2,3,4,5] [--workdir DIR]

Phases (targets from the data-path issue; every wall time is printed with
its CPU-seconds per GiB, and the core count heads the output):

1. Cold pull of a LINKS carton whose --files blobs (--size-mib in all,
   incompressible) are served identity-encoded at /blobs/<sha256>.
   Baseline: ``curl --parallel --parallel-max 8`` of the same blob URLs into
   a directory on the store's filesystem. Ours: ``python -m cartonstore.cli
   add URL --root ROOT --progress none`` in a child process, fresh ROOT each
   round. Baseline and ours alternate, --rounds rounds, the minimum of each is
   reported. Targets: ours <= 1.0 x curl, <= 1.5 CPU-s per GiB, RSS <= 150 MiB.
2. The same blobs served with ``Content-Encoding: zstd`` (pre-compressed with
   ``zstd -q -1``) at /zstd/<sha256>. Baseline (the one the target uses): a
   streaming pipeline, ``curl URL | zstd -d -o FILE`` per blob, all at once.
   Also shown: curl --parallel of the encoded files, then ONE ``zstd -d``
   process over all of them (the SUM of the two). Target: ours <= 1.3 x the
   pipeline.
3. Dedup. A second LINKS carton B reuses all blobs of A but one and adds one
   new blob of 1/9 of the reused bytes, so 90% of B's bytes are shared (A was
   added first, into the root left by phase 1). The origin counts the body
   bytes it sends (Content-Length of every GET it answers, so an aborted
   response counts in full: an upper bound); after adding B they must be
   <= 10% of B's bytes + 1 MiB. The same for remote zips: A and B packed
   Stored without LINKS, served as .carton files, added by URL into a fresh
   root (A's cold pull time is printed too).
4. --procs concurrent ``cartonstore add`` processes of one cold LINKS carton
   (--small-files blobs of --small-mib MiB) on one fresh root: every blob
   path must be GET exactly once at the origin, every process must exit 0.
5. One LINKS carton made of a single --size-mib blob, against ``curl URL |
   tee FILE | sha256sum`` and ``... | openssl dgst -sha256`` (the faster is
   the baseline). Targets: <= 1.2 x it, <= 1.5 CPU-s per GiB, RSS <= 150 MiB.

The origin is a separate process (fetch_origin.py): a small aiohttp app on
127.0.0.1 serving files with sendfile, ``/zstd/<sha256>`` with
``Content-Encoding: zstd``, and counting what it sends.

Nothing is dropped from the page cache on purpose, so files are normally
served from it (the kernel may still reclaim some). ``sync`` runs before every
timed command so that writeback of the previous one is not charged to it.
cartonstore additionally hashes (sha256) and fsyncs every blob, which the
curl baseline does not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve()
PROJECT = HERE.parents[2]
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(HERE.parent))

from fetch_origin import Origin

MiB = 1 << 20
TOML = ('spec_version = 1\nmodel_name = "{name}"\n[runner]\nrunner_name = "x"\n'
        'required_framework_version = "1"\n')


# -- data --------------------------------------------------------------------------


@dataclass(frozen=True)
class Blob:
    sha: str
    size: int
    path: Path


class BlobMaker:
    """Incompressible blobs, fast: one random 1 MiB block, each copy prefixed
    with (blob id, block number) so that no two blocks anywhere are equal."""

    def __init__(self) -> None:
        self.block = os.urandom(MiB)
        self.next_id = 0

    def make(self, directory: Path, mib: int) -> Blob:
        directory.mkdir(parents=True, exist_ok=True)
        uid, self.next_id = self.next_id, self.next_id + 1
        tmp = directory / f".tmp-{uid}"
        h = hashlib.sha256()
        with open(tmp, "wb") as f:
            for j in range(mib):
                chunk = struct.pack("<QQ", uid, j) + self.block[16:]
                h.update(chunk)
                f.write(chunk)
        sha = h.hexdigest()
        path = directory / sha
        os.replace(tmp, path)
        return Blob(sha, mib * MiB, path)


def carton_dir(work: Path, name: str, blobs: list[Blob]) -> Path:
    """An unpacked carton whose model files are hardlinks to the blobs."""
    src = work / f"src-{name}"
    (src / "model").mkdir(parents=True)
    (src / "carton.toml").write_text(TOML.format(name=name))
    for i, b in enumerate(blobs):
        os.link(b.path, src / "model" / f"part{i}.bin")
    return src


def pack(src: Path, out: Path, **kw) -> Path:
    from cartonstore.carton.pack import pack_directory

    pack_directory(src, out, **kw)
    return out


# -- running and timing --------------------------------------------------------------


@dataclass
class Run:
    seconds: float
    rss_kib: int
    cpu: float          # user + sys seconds of the child (not its children)
    stdout: str


def child_run(cmd: list[str], *, check: bool = True, **kw) -> Run:
    """Wall seconds, peak RSS and CPU of one child process."""
    os.sync()  # writeback of earlier work is not charged to this command
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, **kw)
    _, status, usage = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    out = p.stdout.read()
    p.stdout.close()
    if check and p.returncode != 0:
        raise SystemExit(f"{show(cmd)} failed with status {p.returncode}\n{out}")
    return Run(dt, usage.ru_maxrss, usage.ru_utime + usage.ru_stime, out)


def show(cmd: list[str], limit: int = 4) -> str:
    """A command for printing: long URL/-o lists are cut to their first items."""
    words = [shlex.quote(w) for w in cmd]
    urls = [i for i, w in enumerate(cmd) if w.startswith("http://")]
    if len(urls) > limit:
        cut = urls[limit - 1] + 1
        words = [*words[:cut], f"... ({len(urls)} URLs in all)"]
    return " ".join(words)


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(PROJECT)}


def add_cmd(url: str, root: Path) -> list[str]:
    return [sys.executable, "-m", "cartonstore.cli", "add", url, "--root", str(root), "--progress", "none", "--json"]


def ours(url: str, root: Path) -> tuple[Run, dict]:
    from cartonstore.store.materialize.tree import remove_tree

    remove_tree(root)
    run = child_run(add_cmd(url, root), env=cli_env())
    result = json.loads(run.stdout)
    if not result["complete"]:
        raise SystemExit(f"cartonstore add {url} left the carton incomplete: {result}")
    return run, result


def curl_cmd(urls: list[str], outs: list[Path]) -> list[str]:
    cmd = ["curl", "--parallel", "--parallel-max", "8", "-s", "-S", "--no-progress-meter", "--fail", "--noproxy", "*"]
    for url, out in zip(urls, outs, strict=True):
        cmd += ["-o", str(out), url]
    return cmd


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def check_sizes(files: list[Path], blobs: list[Blob]) -> None:
    for f, b in zip(files, blobs, strict=True):
        if f.stat().st_size != b.size:
            raise SystemExit(f"baseline produced {f} with {f.stat().st_size} bytes, expected {b.size}")


def header(text: str) -> None:
    """A phase's title, with the load average: the machine may be shared."""
    print(f"\n== {text} ==  (load average {os.getloadavg()[0]:.2f})")


def mibps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / MiB / seconds:.0f} MiB/s"


def rounds_of(xs: list[float]) -> str:
    return str([round(x, 2) for x in xs])


def durably(cmd: list[str], outs: list[Path]) -> list[str]:
    """cmd, then an fsync of each file it wrote (coreutils sync FILE...): a
    baseline that, like cartonstore, ends when the bytes are on disk."""
    return ["bash", "-c", f"{shlex.join(cmd)} && sync {shlex.join(map(str, outs))}"]


def cpu_per_gib(cpu: float, nbytes: int) -> float:
    """CPU-seconds (user + system) per GiB moved."""
    return cpu / (nbytes / (1 << 30))


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def row(self, what: str, value: str, target: str = "", ok: bool | None = None) -> None:
        self.rows.append((what, value, target, "" if ok is None else ("PASS" if ok else "FAIL")))

    def print(self) -> None:
        head = ("measure", "value", "target", "")
        widths = [max(len(r[i]) for r in [head, *self.rows]) for i in range(4)]
        line = "  ".join("-" * w for w in widths)
        print("\n== summary ==")
        print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip())
        print(line)
        for r in self.rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


# -- phases -------------------------------------------------------------------------


def phase_identity(a, work: Path, origin: Origin, blobs: list[Blob], carton_url: str, rep: Report) -> Path:
    total = sum(b.size for b in blobs)
    header(f"1. cold LINKS pull, identity: {len(blobs)} blobs, {total / MiB:.0f} MiB")
    urls = [origin.url(f"/blobs/{b.sha}") for b in blobs]
    dl = work / "curl"
    outs = [dl / f"{i}" for i in range(len(blobs))]
    base, durable, mine, rss, cpu_b, cpu_m = [], [], [], [], [], []
    root = work / "root-links"
    for _ in range(a.rounds):
        fresh_dir(dl)
        cmd = curl_cmd(urls, outs)
        r = child_run(cmd)
        check_sizes(outs, blobs)
        base.append(r.seconds)
        cpu_b.append(r.cpu)
        fresh_dir(dl)
        durable.append(child_run(durably(cmd, outs)).seconds)
        shutil.rmtree(dl)
        r, result = ours(carton_url, root)
        mine.append(r.seconds)
        rss.append(r.rss_kib)
        cpu_m.append(r.cpu)
    b, m = min(base), min(mine)
    cg_b, cg_m = cpu_per_gib(min(cpu_b), total), cpu_per_gib(min(cpu_m), total)
    print(f"baseline: {show(cmd)}")
    print(f"  {b:.2f} s ({mibps(total, b)})   rounds: {rounds_of(base)}   cpu s: {rounds_of(cpu_b)} "
          f"({cg_b:.2f} per GiB)")
    print(f"ours:     {show(add_cmd(carton_url, root))}")
    print(f"  {m:.2f} s ({mibps(total, m)})   rounds: {rounds_of(mine)}   cpu s: {rounds_of(cpu_m)} "
          f"({cg_m:.2f} per GiB)")
    print(f"  peak RSS {max(rss) / 1024:.0f} MiB; {result['requests']} requests, "
          f"{result['bytes_received'] / MiB:.1f} MiB received")
    d = min(durable)
    print("baseline made durable: the same curl, then sync of its files (what our fsyncs cost the disk)")
    print(f"  {d:.2f} s ({mibps(total, d)})   rounds: {rounds_of(durable)}")
    print(f"time ratio ours/curl: {m / b:.2f} (target <= 1.0); ours/(curl + sync): {m / d:.2f}")
    rep.row("1 identity LINKS: ours / curl --parallel", f"{m:.2f}s / {b:.2f}s = {m / b:.2f}", "<= 1.0", m / b <= 1.0)
    rep.row("1 identity LINKS: ours / (curl --parallel; sync)", f"{m:.2f}s / {d:.2f}s = {m / d:.2f}")
    rep.row("1 identity LINKS: CPU-s per GiB, ours (curl)", f"{cg_m:.2f} ({cg_b:.2f})", "<= 1.5", cg_m <= 1.5)
    rep.row("1 identity LINKS: peak RSS of add", f"{max(rss) / 1024:.0f} MiB", "<= 150 MiB", max(rss) <= 150 * 1024)
    return root  # holds carton A, for phase 3


def phase_zstd(a, work: Path, origin: Origin, blobs: list[Blob], carton_url: str, rep: Report) -> None:
    total = sum(b.size for b in blobs)
    encoded = sum((origin_dir(work) / f"{b.sha}.zst").stat().st_size for b in blobs)
    header(f"2. cold LINKS pull, Content-Encoding: zstd: {total / MiB:.0f} MiB decoded, "
           f"{encoded / MiB:.0f} MiB on the wire (ratio {total / encoded:.4f})")
    urls = [origin.url(f"/zstd/{b.sha}") for b in blobs]
    dl = work / "curl"
    zsts = [dl / f"{i}.zst" for i in range(len(blobs))]
    plain = [dl / f"{i}" for i in range(len(blobs))]
    sums, parts, pipes, durable, floor, mine, rss, cpu_m = [], [], [], [], [], [], [], []
    root = work / "root-zstd"
    for _ in range(a.rounds):
        fresh_dir(dl)
        c_cmd = curl_cmd(urls, zsts)
        rc = child_run(c_cmd)
        d_cmd = ["zstd", "-d", "-q", "-f", *map(str, zsts)]
        rd = child_run(d_cmd)
        check_sizes(plain, blobs)
        sums.append(rc.seconds + rd.seconds)
        parts.append((rc.seconds, rd.seconds))
        fresh_dir(dl)
        p_script = pipeline_script(urls, plain)
        rp = child_run(["bash", "-c", p_script])
        check_sizes(plain, blobs)
        pipes.append(rp.seconds)
        fresh_dir(dl)
        durable.append(child_run(["bash", "-c", f"({p_script}) && sync {shlex.join(map(str, plain))}"]).seconds)
        fresh_dir(dl)
        floor.append(child_run(["bash", "-c", disk_floor_script(plain, blobs)]).seconds)
        shutil.rmtree(dl)
        r, result = ours(carton_url, root)
        mine.append(r.seconds)
        rss.append(r.rss_kib)
        cpu_m.append(r.cpu)
    remove_tree_quiet(root)
    s, p, m = min(sums), min(pipes), min(mine)
    print(f"baseline (sum, reference): {show(c_cmd)}")
    print(f"                         then {show(d_cmd)}")
    print(f"  {s:.2f} s ({mibps(total, s)})   rounds: {rounds_of(sums)}   "
          f"curl / zstd -d: {[(round(x, 2), round(y, 2)) for x, y in parts]}")
    print(f"baseline (pipeline, the target's): bash -c '(curl URL_i | zstd -d -q -o FILE_i) & ... for "
          f"{len(urls)} blobs; wait'")
    print(f"  {p:.2f} s ({mibps(total, p)})   rounds: {rounds_of(pipes)}")
    print(f"baseline (pipeline, then sync of its files): {min(durable):.2f} s   rounds: {rounds_of(durable)}")
    f = min(floor)
    print(f"disk floor: the same bytes from /dev/zero, {len(plain)} files at once, each fsynced (dd conv=fsync): "
          f"{f:.2f} s ({mibps(total, f)})   rounds: {rounds_of(floor)}")
    print("  (a blob is visible only once fsynced: no pull can end before this; the pipeline syncs nothing: "
          f"{f / p:.2f} x its time)")
    print(f"ours: {show(add_cmd(carton_url, root))}")
    print(f"  {m:.2f} s ({mibps(total, m)})   rounds: {rounds_of(mine)}   cpu s: {rounds_of(cpu_m)}")
    print(f"  peak RSS {max(rss) / 1024:.0f} MiB; {result['requests']} requests, "
          f"{result['bytes_received'] / MiB:.1f} MiB received")
    print(f"  {cpu_per_gib(min(cpu_m), total):.2f} CPU-s per GiB")
    print(f"time ratio ours/pipeline: {m / p:.2f} (target <= 1.3); ours/(curl + zstd -d): {m / s:.2f}")
    rep.row("2 zstd LINKS: ours / curl|zstd -d pipeline", f"{m:.2f}s / {p:.2f}s = {m / p:.2f}", "<= 1.3", m / p <= 1.3)
    rep.row("2 zstd LINKS: ours / (pipeline; sync)", f"{m:.2f}s / {min(durable):.2f}s = {m / min(durable):.2f}")
    rep.row("2 zstd LINKS: disk floor (write+fsync) / pipeline", f"{f:.2f}s / {p:.2f}s = {f / p:.2f}")
    rep.row("2 zstd LINKS: ours / disk floor", f"{m:.2f}s / {f:.2f}s = {m / f:.2f}")
    rep.row("2 zstd LINKS: ours / (curl + zstd -d)", f"{m:.2f}s / {s:.2f}s = {m / s:.2f}")
    rep.row("2 zstd LINKS: CPU-s per GiB decoded", f"{cpu_per_gib(min(cpu_m), total):.2f}")
    rep.row("2 zstd LINKS: peak RSS of add", f"{max(rss) / 1024:.0f} MiB", "<= 150 MiB", max(rss) <= 150 * 1024)


def disk_floor_script(outs: list[Path], blobs: list[Blob]) -> str:
    """Write each blob's size of zeros to its file and fsync it, all at once:
    what the disk alone takes to make these bytes durable."""
    jobs = [f"dd if=/dev/zero of={shlex.quote(str(o))} bs=1M count={b.size} iflag=count_bytes conv=fsync status=none "
            for o, b in zip(outs, blobs, strict=True)]
    return parallel_script(jobs)


def pipeline_script(urls: list[str], outs: list[Path]) -> str:
    jobs = [f"(set -o pipefail; curl -s -S --fail --noproxy '*' {shlex.quote(u)} "
            f"| zstd -d -q -f -o {shlex.quote(str(o))})" for u, o in zip(urls, outs, strict=True)]
    return parallel_script(jobs)


def parallel_script(jobs: list[str]) -> str:
    """bash running the jobs at once; fails if any fails."""
    return ("pids=(); " + "; ".join(f"{job} & pids+=($!)" for job in jobs)
            + '; rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc')


def dedup_check(origin: Origin, url: str, root: Path, carton_bytes: int, label: str, rep: Report,
                shared: list[Blob], new: list[Blob], blob_prefix: str | None) -> None:
    origin.reset()
    run = child_run(add_cmd(url, root), env=cli_env())
    result = json.loads(run.stdout)
    st = origin.stats()
    sent = st["bytes_sent"]
    limit = carton_bytes // 10 + MiB
    print(f"{label}: {show(add_cmd(url, root))}")
    print(f"  {run.seconds:.2f} s, complete={result['complete']}; origin sent {sent / MiB:.2f} MiB "
          f"in {sum(v['GET'] for v in st['paths'].values())} GET(s) ({st['aborted']} aborted); "
          f"the add reports {result['bytes_received'] / MiB:.2f} MiB in {result['requests']} request(s)")
    print(f"  carton B: {carton_bytes / MiB:.1f} MiB of files, {sum(b.size for b in new) / MiB:.1f} MiB new; "
          f"sent / B = {sent / carton_bytes:.4f}; limit 10% + 1 MiB = {limit / MiB:.1f} MiB")
    if blob_prefix is not None:
        again = {b.sha[:12]: st["paths"].get(f"{blob_prefix}/{b.sha}", {}).get("GET", 0) for b in shared}
        print(f"  GETs of A's blobs while adding B: {again}")
    rep.row(f"3 dedup {label}: bytes sent for B", f"{sent / MiB:.2f} MiB ({sent / carton_bytes:.2%} of B)",
            f"<= {limit / MiB:.1f} MiB", sent <= limit and result["complete"])


def phase_dedup(a, work: Path, origin: Origin, blobs: list[Blob], new: list[Blob], urls: dict[str, str],
                root_a: Path | None, rep: Report) -> None:
    shared = blobs[:-1]
    b_blobs = shared + new
    b_bytes = sum(b.size for b in b_blobs) + len(TOML.format(name="bench-b"))
    header(f"3. dedup: B shares {len(shared)} blobs ({sum(b.size for b in shared) / MiB:.0f} MiB) with A, "
           f"adds {len(new)} ({sum(b.size for b in new) / MiB:.0f} MiB)")
    if root_a is None:
        root_a = work / "root-links"
        r, _ = ours(urls["links-a"], root_a)
        print(f"carton A (LINKS) added first: {r.seconds:.2f} s")
    else:
        print("carton A (LINKS) is in the root left by phase 1")
    dedup_check(origin, urls["links-b"], root_a, b_bytes, "LINKS", rep, shared, new, "/blobs")
    remove_tree_quiet(root_a)

    root = work / "root-zip"
    zip_a = origin_dir(work) / "zip-a.carton"
    total_a = sum(b.size for b in blobs)
    r, result = ours(urls["zip-a"], root)
    print(f"remote zip A ({zip_a.stat().st_size / MiB:.0f} MiB, Stored), cold: {show(add_cmd(urls['zip-a'], root))}")
    print(f"  {r.seconds:.2f} s ({mibps(total_a, r.seconds)}), peak RSS {r.rss_kib / 1024:.0f} MiB, "
          f"{result['requests']} request(s), {result['bytes_received'] / MiB:.1f} MiB received")
    rep.row("3 remote zip A cold pull (no baseline)", f"{r.seconds:.2f} s, RSS {r.rss_kib / 1024:.0f} MiB")
    dedup_check(origin, urls["zip-b"], root, b_bytes, "remote zip", rep, shared, new, None)
    remove_tree_quiet(root)


def phase_concurrent(a, work: Path, origin: Origin, blobs: list[Blob], url: str, rep: Report) -> None:
    total = sum(b.size for b in blobs)
    header(f"4. {a.procs} concurrent adds of one cold LINKS carton ({len(blobs)} blobs, "
           f"{total / MiB:.0f} MiB) on one fresh root")
    root = work / "root-concurrent"
    remove_tree_quiet(root)
    origin.reset()
    cmd = add_cmd(url, root)
    os.sync()
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(a.procs)]
    errs = [p.communicate()[1] for p in procs]
    dt = time.perf_counter() - t0
    codes = [p.returncode for p in procs]
    st = origin.stats()
    counts = {b.sha[:12]: st["paths"].get(f"/small/{b.sha}", {}).get("GET", 0) for b in blobs}
    carton_path = "/" + url.split("/", 3)[3]
    carton = st["paths"].get(carton_path, {})
    ls = subprocess.run([sys.executable, "-m", "cartonstore.cli", "ls", "--root", str(root), "--json"],
                        env=cli_env(), capture_output=True, text=True, check=True)
    listed = json.loads(ls.stdout)
    remove_tree_quiet(root)
    all_zero = all(c == 0 for c in codes)
    exactly_once = all(v == 1 for v in counts.values())
    print(f"command, {a.procs} at once: {show(cmd)}")
    print(f"  all done in {dt:.2f} s; exit statuses: "
          f"{ {c: codes.count(c) for c in sorted(set(codes))} } (all 0: {all_zero})")
    for e in sorted({e.strip() for e in errs if e.strip()})[:5]:
        print(f"  stderr: {e[:500]}")
    print(f"  GETs per blob path: {counts}  (exactly 1 each: {exactly_once})")
    print(f"  carton {carton_path}: {carton.get('GET', 0)} GET(s), {carton.get('HEAD', 0)} HEAD(s); "
          f"origin sent {st['bytes_sent'] / MiB:.1f} MiB in all")
    state = [(c["manifest_sha256"][:12], "complete" if c["complete"] else "partial") for c in listed]
    print(f"  store afterwards: {state}")
    rep.row(f"4 {a.procs} concurrent adds: GETs per blob", f"{sorted(set(counts.values()))}", "exactly 1", exactly_once)
    rep.row(f"4 {a.procs} concurrent adds: exit statuses", f"{ {c: codes.count(c) for c in sorted(set(codes))} }",
            "all 0", all_zero and len(listed) == 1 and listed[0]["complete"])


def single_baselines(url: str, out: Path) -> dict[str, list[str]]:
    """``curl URL | tee FILE | <hasher>``: the pull a shell script would do,
    with coreutils' sha256sum and with openssl (which uses SHA extensions
    where the CPU has them); the faster is the baseline."""
    curl = f"curl -s -S --fail --noproxy '*' {shlex.quote(url)} | tee {shlex.quote(str(out))}"
    return {"sha256sum": ["bash", "-o", "pipefail", "-c", f"{curl} | sha256sum"],
            "openssl": ["bash", "-o", "pipefail", "-c", f"{curl} | openssl dgst -sha256"],
            "openssl; sync": ["bash", "-o", "pipefail", "-c",
                              f"{curl} | openssl dgst -sha256 && sync {shlex.quote(str(out))}"]}


def phase_single(a, work: Path, origin: Origin, blob: Blob, url: str, rep: Report) -> None:
    header(f"5. one LINKS blob of {blob.size / MiB:.0f} MiB, against curl | tee | sha256")
    root = work / "root-single"
    out = work / "single-curl"
    cmds = single_baselines(origin.url(f"/single/{blob.sha}"), out)
    base: dict[str, list[Run]] = {k: [] for k in cmds}
    runs = []
    for _ in range(a.rounds):
        for k, cmd in cmds.items():
            r = child_run(cmd)
            if blob.sha not in r.stdout:
                raise SystemExit(f"{show(cmd)} printed {r.stdout!r}, not the blob's sha256")
            out.unlink()
            base[k].append(r)
        r, result = ours(url, root)
        runs.append(r)
    remove_tree_quiet(root)
    best = {k: min(x.seconds for x in v) for k, v in base.items()}
    fastest = min(("sha256sum", "openssl"), key=best.get)  # "openssl; sync" is shown, not the target
    b = best[fastest]
    m = min(r.seconds for r in runs)
    rss = max(r.rss_kib for r in runs) / 1024
    cg = cpu_per_gib(min(r.cpu for r in runs), blob.size)
    for k, cmd in cmds.items():
        print(f"baseline ({k}{', the faster' if k == fastest else ''}): {' '.join(cmd[3:])}")
        print(f"  {best[k]:.2f} s ({mibps(blob.size, best[k])})   rounds: {rounds_of([x.seconds for x in base[k]])}")
    print(f"ours: {show(add_cmd(url, root))}")
    print(f"  {m:.2f} s ({mibps(blob.size, m)})   rounds: {rounds_of([r.seconds for r in runs])}   "
          f"cpu s: {rounds_of([r.cpu for r in runs])} ({cg:.2f} per GiB); peak RSS {rss:.0f} MiB "
          f"(rounds: {[round(r.rss_kib / 1024) for r in runs]}); {result['requests']} request(s)")
    print(f"time ratio ours/(curl | tee | {fastest}): {m / b:.2f} (target <= 1.2); "
          f"ours/(... openssl; sync): {m / best['openssl; sync']:.2f}")
    label = f"5 single {blob.size / MiB:.0f} MiB blob"
    rep.row(f"{label}: ours / curl|tee|{fastest}", f"{m:.2f}s / {b:.2f}s = {m / b:.2f}", "<= 1.2", m / b <= 1.2)
    rep.row(f"{label}: ours / curl|tee|openssl; sync", f"{m:.2f}s / {best['openssl; sync']:.2f}s = "
            f"{m / best['openssl; sync']:.2f}")
    rep.row(f"{label}: CPU-s per GiB", f"{cg:.2f}", "<= 1.5", cg <= 1.5)
    rep.row(f"{label}: peak RSS of add", f"{rss:.0f} MiB", "<= 150 MiB", rss <= 150)


def origin_dir(work: Path) -> Path:
    return work / "origin"


def remove_tree_quiet(path: Path) -> None:
    from cartonstore.store.materialize.tree import remove_tree

    remove_tree(path)


def zstd_compress(blobs: list[Blob], out_dir: Path) -> None:
    """zstd -q -1 of each blob into out_dir/<sha256>.zst, two at a time (2 cores)."""
    def start(b: Blob) -> subprocess.Popen:
        return subprocess.Popen(["zstd", "-q", "-1", "-f", str(b.path), "-o", str(out_dir / f"{b.sha}.zst")])

    pending = [start(b) for b in blobs[:2]]
    rest = blobs[2:]
    while pending:
        p = pending.pop(0)
        if p.wait() != 0:
            raise SystemExit("zstd failed")
        if rest:
            pending.append(start(rest.pop(0)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=2048, help="total of the blobs in phases 1-3; the blob of phase 5")
    ap.add_argument("--files", type=int, default=8, help="blobs in phases 1-3 (at least 2)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--procs", type=int, default=50, help="concurrent processes in phase 4")
    ap.add_argument("--small-files", type=int, default=8, help="blobs of the phase 4 carton")
    ap.add_argument("--small-mib", type=int, default=8, help="MiB per blob of the phase 4 carton")
    ap.add_argument("--phases", default="1,2,3,4,5")
    ap.add_argument("--workdir", default=None, help="where the temporary directory goes (default: $TMPDIR)")
    a = ap.parse_args()
    phases = {int(p) for p in a.phases.split(",") if p.strip()}
    per = a.size_mib // a.files
    if a.files < 2 or per < 1:
        raise SystemExit("need --files >= 2 and --size-mib / --files >= 1")

    if a.workdir:  # a --workdir that does not exist yet is created
        Path(a.workdir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cs-bench-fetch-", dir=a.workdir))
    origin = None
    rep = Report()
    try:
        odir = origin_dir(work)
        odir.mkdir()
        origin = Origin(odir)
        print(f"origin: pid {origin.proc.pid} at {origin.base} serving {odir}; {len(os.sched_getaffinity(0))} cores; "
              f"python {sys.version.split()[0]}")
        t0 = time.perf_counter()
        maker = BlobMaker()
        link = {"link_min_size": MiB}
        urls: dict[str, str] = {}
        blobs = new = []
        if phases & {1, 2, 3}:
            blobs = [maker.make(odir / "blobs", per) for _ in range(a.files)]
            src_a = carton_dir(work, "bench-a", blobs)
            pack(src_a, odir / "links-a.carton", link_prefix=origin.url("/blobs"), **link)
            urls["links-a"] = origin.url("/links-a.carton")
        if 2 in phases:
            zstd_compress(blobs, odir)
            pack(src_a, odir / "zstd-a.carton", link_prefix=origin.url("/zstd"), **link)
            urls["zstd-a"] = origin.url("/zstd-a.carton")
        if 3 in phases:
            shared_mib = per * (a.files - 1)
            new = [maker.make(odir / "blobs", max(1, shared_mib // 9))]  # 10% of B is new
            src_b = carton_dir(work, "bench-b", blobs[:-1] + new)
            pack(src_b, odir / "links-b.carton", link_prefix=origin.url("/blobs"), **link)
            pack(src_a, odir / "zip-a.carton", compression="stored")
            pack(src_b, odir / "zip-b.carton", compression="stored")
            urls.update({k: origin.url(f"/{k}.carton") for k in ("links-b", "zip-a", "zip-b")})
        if 4 in phases:
            small = [maker.make(odir / "small", a.small_mib) for _ in range(a.small_files)]
            src_s = carton_dir(work, "bench-small", small)
            pack(src_s, odir / "small.carton", link_prefix=origin.url("/small"), **link)
        for src in work.glob("src-*"):  # hardlinks: the blobs stay under the origin's directory
            shutil.rmtree(src)
        print(f"data prepared in {time.perf_counter() - t0:.1f} s (blobs: {a.files} x {per} MiB)")

        root_a = None
        if 1 in phases:
            root_a = phase_identity(a, work, origin, blobs, urls["links-a"], rep)
        if 2 in phases:
            phase_zstd(a, work, origin, blobs, urls["zstd-a"], rep)
            for b in blobs:
                (odir / f"{b.sha}.zst").unlink()
        if 3 in phases:
            phase_dedup(a, work, origin, blobs, new, urls, root_a if 1 in phases else None, rep)
            for k in ("zip-a", "zip-b"):
                (odir / f"{k}.carton").unlink()
        elif root_a is not None:
            remove_tree_quiet(root_a)
        if 4 in phases:
            phase_concurrent(a, work, origin, small, origin.url("/small.carton"), rep)
        if 5 in phases:
            for b in [*blobs, *new]:  # make room in the page cache
                b.path.unlink()
            single = maker.make(odir / "single", a.size_mib)
            src = carton_dir(work, "bench-single", [single])
            pack(src, odir / "single.carton", link_prefix=origin.url("/single"), **link)
            shutil.rmtree(src)
            phase_single(a, work, origin, single, origin.url("/single.carton"), rep)
        rep.print()
    finally:
        if origin is not None:
            origin.stop()
        remove_tree_quiet(work)


if __name__ == "__main__":
    main()
