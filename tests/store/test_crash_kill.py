"""Invariant 4 under fire: SIGKILL a real `cartonstore` process at a random
moment of `add`, `path` and `gc`, then check that the store

1. passes `verify` (no corrupt or missing blob, no damaged model directory;
   orphan models, unindexed blobs and tmp/ leftovers are allowed: gc's job),
2. serves a successful `path` of the same carton, whose directory matches
   the MANIFEST file by file (the next request repairs or completes),
3. is cleaned by `gc` (grace 0): tmp/ ends up with only owner locks, and no
   unindexed blob or orphan model directory is left.

Each scenario reuses one store root across its runs, so crash leftovers of
one run meet the next run, as on a real node. The kill moment is random
between how long an idle command takes (imports, opening the store) and how
long an uninterrupted run of the scenario's command takes, both measured
first. The randomness is seeded (CARTONSTORE_CRASH_SEED, printed with the run
index in every failure) so a failing run can be replayed:
`CARTONSTORE_CRASH_SEED=<seed> pytest -p no:asyncio tests/store/test_crash_kill.py
-k <scenario>` (same choices and delays; machine timing varies). A new seed
each night with CARTONSTORE_CRASH_ROUNDS=4 searches further than CI does.

The second half SIGKILLs the CLI at exact points (a function patched to kill
its own process), for the windows too narrow for a random kill to hit often.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import textwrap
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import carton_entries, sha, write_zip
from kit.crashkit import (
    PY,
    Carton,
    cli_argv,
    cli_env,
    collect_leftovers,
    model_dir_problems,
    run_cli,
    spawn_and_kill,
    timed,
    tmp_entries,
    toml_for,
    verify_problems,
)
from kit.fetchkit import fast_config, materialize
from kit.origin import Fault, Origin

from cartonstore.format.links import build_links
from cartonstore.store import Store
from cartonstore.store.gc.plan import GcPolicy
from cartonstore.store.materialize.tree import remove_tree

# With `pytest -n N --dist loadgroup` (README, .ci/run) the suite's long,
# process-heavy tests (this module, test_stress.py) run one after another on
# one worker rather than side by side, slowing each other down: the kill
# windows here are calibrated on how long a command takes.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("heavy")]

SEED = int(os.environ.get("CARTONSTORE_CRASH_SEED", "20240917"))
MB = 1 << 20

# scenario -> kill runs (50 in all; CARTONSTORE_CRASH_ROUNDS=4 gives 200, for a deeper run than CI's)
_ROUNDS = int(os.environ.get("CARTONSTORE_CRASH_ROUNDS", "1"))
RUNS = {k: n * _ROUNDS for k, n in {"add-url": 10, "add-links": 10, "path-many": 13, "path-remote": 7, "gc": 10}.items()}


# -- cartons -----------------------------------------------------------------------


@dataclass
class Cartons:
    url_zip: Carton       # a zip served by the origin, added by URL (Range reads), slow headers
    links_slow: Carton    # a local zip whose big files are only in LINKS, served slowly
    many: Carton          # a local zip of 2,000 small files
    many_url: Carton      # 2,000 small files, the zip served by the origin
    links_fast: Carton    # LINKS blobs served at full speed


def _rand(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


def _many_files(rng: random.Random, model_name: str) -> dict[str, bytes]:
    # 2,000 files from a pool of 250 contents: the tree has 2,000 entries to
    # build or remove, the store 250 blobs (each blob is stored once).
    pool = [_rand(rng, rng.randint(16, 2048)) for _ in range(250)]
    files = {"carton.toml": toml_for(model_name)}
    for i in range(2000):
        files[f"model/layer{i // 100:02d}/part{i:04d}.bin"] = pool[i % len(pool)]
    return files


def _linked(tmp: Path, origin: Origin, name: str, blobs: dict[str, bytes],
            faults: dict[str, Fault] | None = None, encodings: dict[str, str] | None = None) -> Carton:
    """A local carton whose files are only in LINKS, served by origin; the
    zip holds just carton.toml (which eviction keeps), so every blob gc
    evicts can be fetched again by hash."""
    links = {}
    for p, data in blobs.items():
        digest = sha(data)
        origin.put(f"/blobs/{digest}", data, fault=(faults or {}).get(p), encoding=(encodings or {}).get(p))
        links[digest] = [origin.url(f"/blobs/{digest}")]
    files = {"carton.toml": toml_for(name), **blobs}
    path = write_zip(tmp / f"{name}.carton", carton_entries(files, links=build_links(links), omit=tuple(blobs)))
    return Carton(name, str(path), files)


@pytest.fixture(scope="module")
def origin() -> Iterator[Origin]:
    with Origin() as o:
        yield o


@pytest.fixture(scope="module")
def cartons(tmp_path_factory, origin: Origin) -> Cartons:
    tmp = tmp_path_factory.mktemp("cartons")
    rng = random.Random(f"{SEED}:cartons")

    # by URL: 4 big entries (1.5-3 MiB) and 30 small ones, deflated; every
    # request's headers wait 30 ms, so the add spans several slow round trips
    files = {"carton.toml": toml_for("remote")}
    for i, size in enumerate((3 * MB // 2, 2 * MB, 5 * MB // 2, 3 * MB)):
        files[f"model/w{i}.bin"] = _rand(rng, size)
    for i in range(30):
        files[f"misc/note{i:02d}.txt"] = _rand(rng, rng.randint(10, 4000))
    zpath = write_zip(tmp / "remote.carton", carton_entries(files), method=zipfile.ZIP_DEFLATED)
    origin.put_file("/cartons/remote.carton", zpath, fault=Fault(delay=0.03))
    url_zip = Carton("remote", origin.url("/cartons/remote.carton"), files)

    # LINKS, slow: 4 blobs of 1-4 MiB; each response waits 20-80 ms for its
    # headers, then stalls 100-200 ms a third of the way into its body, so a
    # kill often finds half-written downloads in tmp/. One is gzip-encoded.
    big = {f"model/shard{i}.bin": _rand(rng, rng.randint(1 * MB, 4 * MB)) for i in range(4)}
    faults = {p: Fault(delay=rng.uniform(0.02, 0.08), stall_at=len(d) // 3, stall_seconds=rng.uniform(0.1, 0.2))
              for p, d in big.items()}
    big["misc/readme.txt"] = _rand(rng, 300)
    links_slow = _linked(tmp, origin, "links-slow", big, faults, {"model/shard1.bin": "gzip"})

    many_files = _many_files(rng, "many")
    many = Carton("many", str(write_zip(tmp / "many.carton", carton_entries(many_files))), many_files)

    many_url_files = _many_files(rng, "many-url")
    mpath = write_zip(tmp / "many-url.carton", carton_entries(many_url_files))
    many_url = Carton("many-url", origin.put_file("/cartons/many-url.carton", mpath), many_url_files)

    fast = {f"model/fast{i}.bin": _rand(rng, rng.randint(MB // 2, 3 * MB // 2)) for i in range(3)}
    fast["misc/fast.txt"] = b"fast\n"
    links_fast = _linked(tmp, origin, "links-fast", fast)
    return Cartons(url_zip, links_slow, many, many_url, links_fast)


# -- scenarios ---------------------------------------------------------------------


@dataclass
class Step:
    argv: list[str]
    targets: list[Carton]     # cartons a `path` must serve whole after the crash
    note: str = ""


def _known(store: Store, c: Carton) -> bool:
    return store.index.carton(c.digest) is not None


def _forget_or_evict(store: Store, c: Carton, rng: random.Random) -> str:
    """Put the carton back to "not in the store" (rm) or "known, blobs
    evicted" (gc over budget), so the next add has work to do."""
    if not _known(store, c):
        return "absent"
    if rng.random() < 0.5:
        store.remove(c.digest)
        return "removed"
    store.collect(GcPolicy(max_size=0, grace=0))
    return "evicted"


def prepare_add_url(store: Store, cs: Cartons, rng: random.Random) -> Step:
    state = _forget_or_evict(store, cs.url_zip, rng)
    return Step(cli_argv(store.root, "add", cs.url_zip.source, "--progress", "none"), [cs.url_zip], state)


def prepare_add_links(store: Store, cs: Cartons, rng: random.Random) -> Step:
    state = _forget_or_evict(store, cs.links_slow, rng)
    return Step(cli_argv(store.root, "add", cs.links_slow.source, "--progress", "none"), [cs.links_slow], state)


def prepare_path_many(store: Store, cs: Cartons, rng: random.Random) -> Step:
    if not _known(store, cs.many):
        store.add(cs.many.source)
    # the model directory goes (as gc or rm would take it); the blobs stay,
    # so `path` only builds the 2,000-entry tree
    remove_tree(store.layout.model_path(cs.many.digest))
    ref = rng.choice([cs.many.digest, cs.many.digest[:12], "many"])
    return Step(cli_argv(store.root, "path", ref, "--progress", "none"), [cs.many], f"ref={ref}")


def prepare_path_remote(store: Store, cs: Cartons, rng: random.Random) -> Step:
    for c in (cs.url_zip, cs.links_slow):
        if not _known(store, c):
            materialize(store, c.source, fast_config())
    # evict every model and blob but the MANIFEST and carton.toml: `path`
    # must fetch (from LINKS, or the carton's own zip) and then build
    store.collect(GcPolicy(max_size=0, grace=0))
    c = rng.choice([cs.url_zip, cs.links_slow])
    return Step(cli_argv(store.root, "path", c.digest, "--progress", "none"), [c], c.label)


def prepare_gc(store: Store, cs: Cartons, rng: random.Random) -> Step:
    for c in (cs.many_url, cs.links_fast):
        materialize(store, c.digest if _known(store, c) else c.source, fast_config())
    args = ["gc", "--local", "--max-size", "0"] + (["--grace", "0"] if rng.random() < 0.5 else [])
    return Step(cli_argv(store.root, *args), [cs.many_url, cs.links_fast], " ".join(args[1:]))


PREPARE: dict[str, Callable[[Store, Cartons, random.Random], Step]] = {
    "add-url": prepare_add_url,
    "add-links": prepare_add_links,
    "path-many": prepare_path_many,
    "path-remote": prepare_path_remote,
    "gc": prepare_gc,
}


# -- the check after every run ---------------------------------------------------------


def recover_and_check(root: Path, step: Step, ctx: str, seen: Counter) -> None:
    with Store(root) as store:
        report = store.verify()
        assert report.ok, f"{ctx}: verify after the kill: {verify_problems(report)}"
        if report.unindexed_blobs:
            seen["unindexed blobs left"] += 1
        if report.orphan_models:
            seen["orphan models left"] += 1
        if [n for n in tmp_entries(root) if not n.startswith("owner-")]:
            seen["tmp/ work left"] += 1
        for c in step.targets:
            # what a loader asks for: the carton by hash once the store knows
            # it, else its source again
            ref = c.digest if _known(store, c) else c.source
            try:
                path = materialize(store, ref, fast_config())
            except Exception as e:  # noqa: BLE001 - reported with the run's context
                pytest.fail(f"{ctx}: `path {ref}` after the kill failed: {type(e).__name__}: {e}")
            assert path == store.layout.model_path(c.digest), f"{ctx}: path {path}"
            problems = model_dir_problems(path, c)
            assert not problems, f"{ctx}: model dir of {c.label} after the kill: {problems[:8]}"
        collect_leftovers(store, ctx)


@pytest.mark.parametrize("scenario", list(RUNS))
def test_sigkill_at_a_random_moment(scenario: str, cartons: Cartons, tmp_path: Path) -> None:
    rng = random.Random(f"{SEED}:{scenario}")
    root = tmp_path / "root"
    prepare = PREPARE[scenario]
    seen: Counter = Counter()

    # Calibration: the faster of two uninterrupted runs (the first also
    # creates the store) is how long the command takes; `path` of a model
    # already there is how long any command takes before it does real work
    # (imports, opening the store). Kills land at random in between, so
    # nearly all find the command at work.
    took = float("inf")
    for n in range(2):
        with Store(root) as store:
            step = prepare(store, cartons, rng)
        cp, t = timed(run_cli, step.argv)
        ctx = f"seed={SEED} scenario={scenario} calibration run {n} ({step.note})"
        assert cp.returncode == 0, f"{ctx}: {cp.stderr}"
        recover_and_check(root, step, ctx, seen)
        took = min(took, t)
    idle = min(timed(run_cli, cli_argv(root, "path", step.targets[0].digest, "--progress", "none"))[1]
               for _ in range(2))
    lo = min(idle * 0.9, took * 0.8)
    hi = took * 1.05

    # RUNS[scenario] kills of a running command; a command that finished
    # before its kill was due still gets the checks, and one more run
    delays, attempts = [], 0
    while seen["killed mid-run"] < RUNS[scenario] and attempts < 6 * RUNS[scenario]:
        i, attempts = attempts, attempts + 1
        with Store(root) as store:
            step = prepare(store, cartons, rng)
        delay = rng.uniform(lo, hi)
        ctx = f"seed={SEED} scenario={scenario} run={i} delay={delay:.3f}s ({step.note})"
        out = spawn_and_kill(step.argv, delay)
        delays.append(delay)
        if out.killed_alive:
            seen["killed mid-run"] += 1
        else:
            seen["finished first"] += 1
            assert out.returncode == 0, f"{ctx}: the uninterrupted command failed: {out.stderr[-2000:]}"
            # The machine is faster than the calibration said (or less loaded):
            # pull the window in so the next kills land while the command runs.
            hi = max(lo + 0.02, min(hi, delay * 0.9))
            if hi <= lo + 0.02:
                lo *= 0.8
        recover_and_check(root, step, ctx, seen)

    print(f"\n[{scenario}] seed={SEED} command {took:.2f}s, idle command {idle:.2f}s, kills at "
          f"[{lo:.2f}, {hi:.2f}]s (median {statistics.median(delays):.2f}s): {dict(seen)}")
    assert seen["killed mid-run"] == RUNS[scenario], (
        f"seed={SEED} {scenario}: the kill window [{lo:.2f}, {hi:.2f}]s missed the command too often: {dict(seen)}")


# -- kills at exact points -------------------------------------------------------------
#
# A random kill rarely lands in a window of a few milliseconds. Here the CLI
# runs with one store function patched to SIGKILL its own process the moment
# it is called (or part-way through), which is what a crash at that instant
# leaves behind. Then the same checks as above.

_KILLER = textwrap.dedent("""
    import os, signal, sys, importlib
    mod_name, attr, when = sys.argv[1], sys.argv[2], sys.argv[3]
    mod = importlib.import_module(mod_name)
    owner_name, _, fn_name = attr.rpartition(".")
    owner = getattr(mod, owner_name) if owner_name else mod
    original = getattr(owner, fn_name)
    calls = [0]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def patched(*a, **kw):
        calls[0] += 1
        if when == "before":
            die()
        if when.startswith("call"):
            if calls[0] == int(when[4:]):
                die()
            return original(*a, **kw)
        original(*a, **kw)
        die()

    setattr(owner, fn_name, patched)
    from cartonstore.cli import main
    sys.exit(main(sys.argv[4:]))
""")


def run_until_killed(root: Path, module: str, attr: str, when: str, *args: str) -> int:
    """Run `cartonstore ARGS` with module.attr patched to SIGKILL the process
    ("before" the call, "after" it returns, or at its Nth call "callN")."""
    cp = subprocess.run([PY, "-c", _KILLER, module, attr, when, *args, "--root", str(root)],
                        capture_output=True, text=True, timeout=120, env=cli_env())
    return cp.returncode


@dataclass(frozen=True)
class CrashPoint:
    name: str
    module: str
    attr: str
    when: str
    command: str      # "add-links" | "path-links" | "path-many" | "gc" | "rm"
    leaves: str = ""  # what the kill must have left, so the point is the one meant:
                      # "unindexed" blob files, or "tmp" work


CRASH_POINTS = [
    # a LINKS blob was renamed into blobs/ but its index row not committed yet
    CrashPoint("fetch: blob renamed, row not written", "cartonstore.store.metadata.index", "Index.record_blobs",
               "before", "add-links", "unindexed"),
    CrashPoint("fetch: blob renamed, row not written (path)", "cartonstore.store.metadata.index", "Index.record_blobs",
               "before", "path-links", "unindexed"),
    # gc: rows of evicted blobs dropped, files not yet deleted
    CrashPoint("gc: rows forgotten, files still there", "cartonstore.store.metadata.index", "Index.forget_blobs",
               "after", "gc", "unindexed"),
    # gc: killed while deleting a model directory (after 100 unlinks)
    CrashPoint("gc: half-deleted model directory", "os", "unlink", "call100", "gc"),
    # rm: killed while deleting the model directory
    CrashPoint("rm: half-deleted model directory", "os", "unlink", "call100", "rm"),
    # path: the tree is built in tmp/, killed just before the rename
    CrashPoint("path: tree built, not renamed", "os", "rename", "before", "path-many", "tmp"),
]


@pytest.mark.parametrize("point", CRASH_POINTS, ids=[p.name for p in CRASH_POINTS])
def test_sigkill_at_exact_points(point: CrashPoint, cartons: Cartons, tmp_path: Path) -> None:
    root = tmp_path / "root"
    ctx = f"crash point {point.name!r} ({point.module}.{point.attr} {point.when}, command {point.command})"
    links, many = cartons.links_fast, cartons.many
    with Store(root) as store:
        if point.command == "add-links":
            args, targets = ["add", links.source, "--progress", "none"], [links]
        elif point.command == "path-links":
            materialize(store, links.source, fast_config())
            store.collect(GcPolicy(max_size=0, grace=0))
            args, targets = ["path", links.digest, "--progress", "none"], [links]
        elif point.command == "path-many":
            store.add(many.source)
            args, targets = ["path", many.digest, "--progress", "none"], [many]
        elif point.command == "gc":
            materialize(store, links.source, fast_config())
            materialize(store, many.source, fast_config())
            args, targets = ["gc", "--local", "--max-size", "0"], [links]
        else:  # rm; then the carton is added again and its path asked for
            materialize(store, many.source, fast_config())
            args, targets = ["rm", many.digest], [many]
    code = run_until_killed(root, point.module, point.attr, point.when, *args)
    assert code in (-9, 0), f"{ctx}: the command failed before the crash point (exit {code})"
    if code == -9 and point.leaves:
        with Store(root) as store:
            report = store.verify()
        left = {"unindexed": bool(report.unindexed_blobs),
                "tmp": any(not n.startswith("owner-") for n in tmp_entries(root))}[point.leaves]
        assert left, f"{ctx}: the kill did not leave {point.leaves!r} state: not the crash point meant"
    recover_and_check(root, Step([], targets, point.name), ctx, Counter())
    if code == 0:  # the code changed and no longer passes there: the store was checked all the same
        pytest.skip(f"{ctx}: the command finished without reaching the crash point")
