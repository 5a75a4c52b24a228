"""Invariant 3 under load: two daemons on ONE store root, CLI processes and a
gc loop, all at once, while a checker reads every file of every live lease.

* two `cartonstore serve` processes, each on its own Unix socket, same ROOT;
* worker threads doing random operations: lease (through either daemon,
  by hash, name or source), release (through either daemon), and CLI
  subprocesses `add`, `path`, `rm` (of a leased carton: 409 Conflict, fine)
  and `gc` (in the process, or run by a daemon);
* a gc thread collecting in this process, over a size budget smaller than
  the cartons, so it keeps evicting whatever is not leased;
* a checker thread reading every file of every live lease (taken, not yet
  released, well before its ttl) and comparing its sha256 with the MANIFEST.

Pass: no file missing or wrong under a live lease, no daemon 500 or CLI
crash, and `verify` clean at the end. Operations are counted by kind and
outcome and printed. Seeded (CARTONSTORE_STRESS_SEED, printed): the choices
replay, the interleaving does not.
"""

from __future__ import annotations

import os
import random
import threading
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import carton_entries, sha, write_zip
from kit.crashkit import Carton, cli_argv, hash_path, run_cli, toml_for, verify_problems
from kit.daemonkit import DaemonProcess

from cartonstore.client.leases import Client
from cartonstore.errors import CartonStoreError
from cartonstore.format.links import build_links
from cartonstore.store import Store
from cartonstore.store.gc.plan import GcPolicy

# With `pytest -n N --dist loadgroup` (README, .ci/run) the suite's long,
# process-heavy tests (this module, test_crash_kill.py) run one after another
# on one worker rather than side by side, slowing each other down: this test
# must reach its operation count within TIME_LIMIT.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("heavy")]

SEED = int(os.environ.get("CARTONSTORE_STRESS_SEED", "4242"))
# operations by the workers and the gc loop together (CARTONSTORE_STRESS_OPS for a longer run)
TARGET_OPS = int(os.environ.get("CARTONSTORE_STRESS_OPS", "700"))
TIME_LIMIT = 180.0          # seconds of load at most (it stops at TARGET_OPS, ~30 s here)
WORKERS = 4
TTL = 30.0                  # lease ttl; leases are held 0.05-2.5 s
NEAR_EXPIRY = 5.0           # the checker leaves alone leases this close to their expiry
KB, MB = 1 << 10, 1 << 20

# what a failed operation may legitimately say under this load (anything else,
# a 500 or a CLI crash, fails the test)
EXPECTED_FAILURES = {
    # a carton removed by `rm` meanwhile, or a local carton whose blobs gc
    # evicted leased by hash or name (it must be added again)
    "lease": {"NotFound", "Unavailable"},
    "path": {"exit 3"},
    "rm": {"exit 7 (leased)", "exit 3"},
    "add": set(),
    "gc": set(),
    # a lease given back after its ttl ran out (the worker was held up past
    # it by a slow CLI call on a loaded machine) is gone, as leases are
    "release": {"NotFound after its ttl"},
}


# -- cartons --------------------------------------------------------------------------


@dataclass
class StressCarton:
    carton: Carton
    refs: list[str]          # what a loader may ask for: hash, name, source
    add_source: str          # what `add` takes


def build_cartons(tmp: Path, origin, rng: random.Random) -> list[StressCarton]:
    out = []
    shared = rng.randbytes(50 * KB)  # listed by two cartons: a blob stored once, freed when both go

    def local(name: str, files: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> None:
        files = {"carton.toml": toml_for(name), **files}
        path = write_zip(tmp / f"{name}.carton", carton_entries(files), method=method)
        c = Carton(name, str(path), files)
        out.append(StressCarton(c, [c.digest, name, str(path), str(path), str(path)], str(path)))

    def linked(name: str, blobs: dict[str, bytes]) -> None:
        links = {}
        for data in blobs.values():
            links[sha(data)] = [origin.put(f"/blobs/{sha(data)}", data)]
        files = {"carton.toml": toml_for(name), **blobs}
        path = write_zip(tmp / f"{name}.carton", carton_entries(files, links=build_links(links), omit=tuple(blobs)))
        c = Carton(name, str(path), files)
        out.append(StressCarton(c, [c.digest, c.digest, name, str(path)], str(path)))

    def remote(name: str, files: dict[str, bytes]) -> None:
        files = {"carton.toml": toml_for(name), **files}
        path = write_zip(tmp / f"{name}.carton", carton_entries(files), method=zipfile.ZIP_DEFLATED)
        url = origin.put_file(f"/cartons/{name}.carton", path)
        c = Carton(name, url, files)
        out.append(StressCarton(c, [c.digest, c.digest, name, url], url))

    local("s-small", {"model/w.bin": rng.randbytes(300 * KB), "misc/tokenizer.json": shared})
    local("s-tree", {**{f"model/t{i:03d}.bin": rng.randbytes(rng.randint(100, 3000)) for i in range(200)},
                     "misc/tokenizer.json": shared}, zipfile.ZIP_DEFLATED)
    local("s-big", {"model/a.bin": rng.randbytes(MB), "model/b.bin": rng.randbytes(MB)})
    common = rng.randbytes(400 * KB)
    linked("s-linked-a", {"model/x.bin": rng.randbytes(700 * KB), "model/y.bin": rng.randbytes(500 * KB),
                          "model/common.bin": common})
    linked("s-linked-b", {"model/z.bin": rng.randbytes(900 * KB), "model/common.bin": common})
    remote("s-remote", {f"model/r{i}.bin": rng.randbytes(rng.randint(200 * KB, 500 * KB)) for i in range(4)})
    return out


# -- shared state --------------------------------------------------------------------


@dataclass(eq=False)
class LiveLease:
    id: str
    carton: Carton
    path: Path
    expires_at: float         # wall clock, from the daemon
    release_at: float         # monotonic, when the worker gives it back
    daemon: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    live: bool = True


class Board:
    """Live leases, counters and violations, shared by every thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.leases: dict[str, LiveLease] = {}
        self.ops: Counter = Counter()
        self.unexpected: list[str] = []
        self.violations: list[str] = []
        self.checks = Counter()
        self.examples: dict[tuple[str, str], str] = {}

    def count(self, kind: str, outcome: str, detail: str = "") -> None:
        with self.lock:
            self.ops[(kind, outcome)] += 1
            if outcome != "ok":
                self.examples.setdefault((kind, outcome), detail[-300:])
            if outcome != "ok" and outcome not in EXPECTED_FAILURES.get(kind, set()):
                self.unexpected.append(f"{kind}: {outcome}: {detail[-600:]}")

    def total(self) -> int:
        with self.lock:
            return sum(self.ops.values())

    def register(self, lease: LiveLease) -> None:
        with self.lock:
            self.leases[lease.id] = lease

    def unregister(self, lease: LiveLease) -> None:
        """After this returns the checker never reads the lease again, so it
        may be released."""
        with lease.lock:
            lease.live = False
        with self.lock:
            self.leases.pop(lease.id, None)

    def live(self) -> list[LiveLease]:
        with self.lock:
            return list(self.leases.values())

    def leased_digests(self) -> set[str]:
        with self.lock:
            return {lease.carton.digest for lease in self.leases.values()}


def outcome_of(e: BaseException) -> str:
    if type(e) is CartonStoreError:
        return "HTTP 500"
    return type(e).__name__


# -- threads ---------------------------------------------------------------------------


def checker(board: Board, stop: threading.Event) -> None:
    """Read every file of every live lease, again and again."""
    while not stop.is_set():
        leases = board.live()
        if not leases:
            time.sleep(0.005)
        for lease in leases:
            with lease.lock:
                if not lease.live:
                    continue
                if lease.expires_at - time.time() < NEAR_EXPIRY:
                    board.checks["skipped near expiry"] += 1
                    continue
                expected = lease.carton.expected()
                problems = []
                try:
                    if (lease.path / "MANIFEST").read_bytes() != lease.carton.manifest:
                        problems.append("MANIFEST differs")
                except OSError as e:
                    problems.append(f"MANIFEST: {e}")
                for rel, digest in expected.items():
                    try:
                        got = hash_path(lease.path / rel)
                    except OSError as e:
                        problems.append(f"{rel}: {type(e).__name__}: {e.strerror}")
                        continue
                    if got != digest:
                        problems.append(f"{rel}: sha256 {got}, MANIFEST says {digest}")
                board.checks["lease dirs checked"] += 1
                board.checks["files read"] += len(expected)
                if problems:
                    with board.lock:
                        board.violations.append(
                            f"lease {lease.id} (daemon {lease.daemon}) on {lease.carton.label} at {lease.path}, "
                            f"{lease.expires_at - time.time():.1f}s before expiry: {problems[:5]}")


def gc_loop(root: Path, budget: int, board: Board, stop: threading.Event, rng: random.Random) -> None:
    with Store(root) as store:
        while not stop.is_set():
            try:
                report = store.collect(GcPolicy(max_size=budget, grace=0))
                board.count("gc", "ok")
                if report.evicted_models:
                    board.checks["models evicted by the gc loop"] += len(report.evicted_models)
            except CartonStoreError as e:
                board.count("gc", outcome_of(e), str(e))
            stop.wait(rng.uniform(0.05, 0.3))


class Worker:
    def __init__(self, wid: int, root: Path, sockets: list[Path], cartons: list[StressCarton], budget: int,
                 board: Board, deadline: float) -> None:
        self.wid = wid
        self.root = root
        self.sockets = sockets
        self.clients = [Client(s, timeout=60) for s in sockets]
        self.cartons = cartons
        self.budget = budget
        self.board = board
        self.deadline = deadline
        self.rng = random.Random(f"{SEED}:worker{wid}")
        self.held: list[LiveLease] = []

    def run(self) -> None:
        ops = [(self.lease, 55), (self.cli_path, 4), (self.cli_add, 5), (self.cli_rm, 4), (self.cli_gc, 3)]
        fns, weights = zip(*ops, strict=True)
        while time.monotonic() < self.deadline and self.board.total() < TARGET_OPS:
            self.release_due()
            self.rng.choices(fns, weights)[0]()
            time.sleep(self.rng.uniform(0, 0.02))
        for lease in list(self.held):
            self.release(lease)

    # -- leases

    def lease(self) -> None:
        sc = self.rng.choice(self.cartons)
        ref = self.rng.choice(sc.refs)
        d = self.rng.randrange(len(self.clients))
        try:
            got = self.clients[d].acquire(ref, TTL, holder=f"stress-{self.wid}", timeout=60)
        except CartonStoreError as e:
            self.board.count("lease", outcome_of(e), f"{sc.carton.label} by {ref}: {e}")
            return
        if got.manifest_sha256 != sc.carton.digest or got.path != self.root / "models" / sc.carton.digest:
            self.board.count("lease", "wrong answer", f"{ref} -> {got}")
            return
        self.board.count("lease", "ok")
        live = LiveLease(got.id, sc.carton, got.path, got.expires_at,
                         time.monotonic() + self.rng.uniform(0.05, 2.5), d)
        self.held.append(live)
        self.board.register(live)

    def release_due(self) -> None:
        now = time.monotonic()
        for lease in [x for x in self.held if x.release_at <= now]:
            self.release(lease)

    def release(self, lease: LiveLease) -> None:
        self.held.remove(lease)
        self.board.unregister(lease)
        d = self.rng.randrange(len(self.clients))  # either daemon: leases live in the shared index
        try:
            self.clients[d].release(lease.id)
            self.board.count("release", "ok")
        except CartonStoreError as e:
            outcome = outcome_of(e)
            if outcome == "NotFound" and time.time() >= lease.expires_at:
                outcome = "NotFound after its ttl"
            self.board.count("release", outcome, f"{lease.id} via daemon {d}: {e}")

    # -- CLI processes

    def cli(self, kind: str, *args: str, codes: dict[int, str] | None = None) -> None:
        cp = run_cli(cli_argv(self.root, *args))
        outcome = "ok" if cp.returncode == 0 else (codes or {}).get(cp.returncode, f"exit {cp.returncode}")
        if "Traceback" in cp.stderr:
            outcome = "crash"
        self.board.count(kind, outcome, f"{' '.join(args)}: {cp.stderr.strip()}")

    def cli_path(self) -> None:
        sc = self.rng.choice(self.cartons)
        self.cli("path", "path", self.rng.choice(sc.refs), "--progress", "none")

    def cli_add(self) -> None:
        sc = self.rng.choice(self.cartons)
        self.cli("add", "add", sc.add_source, "--progress", "none")

    def cli_rm(self) -> None:
        # a leased carton (409 expected), one nobody leases right now, or any
        leased = self.board.leased_digests()
        pools = [[sc for sc in self.cartons if sc.carton.digest in leased],
                 [sc for sc in self.cartons if sc.carton.digest not in leased], self.cartons]
        pool = self.rng.choices(pools, [4, 4, 2])[0]
        sc = self.rng.choice(pool or self.cartons)
        self.cli("rm", "rm", sc.carton.digest, codes={7: "exit 7 (leased)"})

    def cli_gc(self) -> None:
        args = ["gc", "--max-size", str(self.budget), "--grace", "0"]
        if self.rng.random() < 0.5:
            args.append("--local")
        else:  # run by a daemon, between its requests
            args += ["--socket", str(self.rng.choice(self.sockets))]
        self.cli("gc", *args)


# -- the test ----------------------------------------------------------------------------


def test_two_daemons_cli_and_gc_on_one_store(tmp_path: Path, short_tmp: Path, origin) -> None:
    rng = random.Random(f"{SEED}:setup")
    cartons = build_cartons(tmp_path, origin, rng)
    total = sum(sc.carton.size for sc in cartons)
    budget = total * 2 // 5  # gc keeps evicting whatever is not leased
    root = short_tmp / "root"   # a daemon's root is short: runner sockets go under it
    Store(root).close()

    board = Board()
    stop = threading.Event()
    daemons = [DaemonProcess(root, listen=None, socket_path=short_tmp / f"d{i}.sock",
                             extra_args=["--log-level", "warning"]) for i in (1, 2)]
    logs: list[list[str]] = [[], []]
    drains: list[threading.Thread] = []
    threads: list[threading.Thread] = []
    background: list[threading.Thread] = []   # the checker and the gc loop, until stop is set
    started = time.monotonic()
    try:
        for i, d in enumerate(daemons):
            d.start()
            # drain stderr so a chatty daemon never blocks on a full pipe
            t = threading.Thread(target=lambda d=d, i=i: logs[i].append(d.proc.stderr.read()), daemon=True)
            t.start()
            drains.append(t)
        check = threading.Thread(target=checker, args=(board, stop), name="checker", daemon=True)
        gc = threading.Thread(target=gc_loop, args=(root, budget, board, stop, random.Random(f"{SEED}:gc")),
                              name="gc-loop", daemon=True)
        background = [check, gc]
        for t in background:
            t.start()
        deadline = time.monotonic() + TIME_LIMIT
        workers = [Worker(w, root, [d.socket_path for d in daemons], cartons, budget, board, deadline)
                   for w in range(WORKERS)]
        threads = [threading.Thread(target=w.run, name=f"worker-{w.wid}", daemon=True) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIME_LIMIT + 120)
        assert not any(t.is_alive() for t in threads), "a worker is stuck"
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        for t in background:   # verify at the end runs on a quiet store: after the gc loop's last collection
            t.join(60)
        codes = [d.stop() if d.proc else None for d in daemons]
        for t in drains:
            t.join(10)
    elapsed = time.monotonic() - started
    assert not any(t.is_alive() for t in background), "the gc loop or the checker is stuck"

    with Store(root) as store:
        report = store.verify()
        left_leases = store.index.count_live_leases()

    ops = board.ops
    kinds = sorted({k for k, _ in ops})
    lines = [f"seed={SEED}: {sum(ops.values())} operations in {elapsed:.1f}s "
             f"(budget {budget} of {total} bytes of cartons)"]
    for k in kinds:
        lines.append(f"  {k:8} " + ", ".join(f"{o}: {n}" for (kk, o), n in sorted(ops.items()) if kk == k))
    lines.append(f"  checker: {dict(board.checks)}")
    lines += [f"  e.g. {k} {o}: {text}" for (k, o), text in sorted(board.examples.items())]
    print("\n" + "\n".join(lines))
    daemon_logs = "\n".join("".join(x) for x in logs)

    assert not board.violations, (f"seed={SEED}: {len(board.violations)} check(s) of a live lease found files "
                                  f"missing or wrong:\n" + "\n".join(board.violations[:10]))
    assert report.ok, f"seed={SEED}: verify at the end: {verify_problems(report)}"
    assert not board.unexpected, (f"seed={SEED}: {len(board.unexpected)} unexpected outcome(s):\n"
                                  + "\n".join(board.unexpected[:10]) + "\n" + _daemon_errors(daemon_logs))
    assert "Traceback" not in daemon_logs and "unexpected error" not in daemon_logs, daemon_logs[-3000:]
    assert codes == [0, 0], f"daemons exited {codes}: {daemon_logs[-2000:]}"
    assert left_leases == 0, f"seed={SEED}: {left_leases} lease(s) still live after every release"
    assert sum(ops.values()) >= TARGET_OPS * 5 // 6, "\n".join(lines)
    assert board.checks["lease dirs checked"] > 0


def _daemon_errors(logs: str) -> str:
    """The daemons' tracebacks and error lines, for a failure message."""
    at = logs.find("Traceback")
    if at >= 0:
        return "daemon log:\n" + logs[max(0, at - 500):at + 4000]
    return "daemon log (tail):\n" + logs[-2000:]
