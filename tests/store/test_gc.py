"""Garbage collection: the pure plan, then real stores, leases, pins and tmp/."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MINIMAL_TOML, sha, snapshot, work_in_tmp
from kit.daemonkit import wait_for_async
from kit.prockit import descriptors_of

from cartonstore.cli.commands import main
from cartonstore.store import Store
from cartonstore.store.gc.plan import CartonUse, GcPolicy, Snapshot, plan_collection

NOW = 1_000_000.0


def use(digest: str, last_used: float, listed: set[str], *, materialized: bool = True, leased: bool = False,
        keep: frozenset[str] = frozenset()) -> CartonUse:
    return CartonUse(digest, last_used, materialized, leased, frozenset(listed), keep)


def snap(blobs: dict[str, int], cartons: list[CartonUse], *, added: float = 0.0, free: int = 10**12,
         unindexed: dict[str, tuple[int, float]] | None = None) -> Snapshot:
    return Snapshot({d: (s, added) for d, s in blobs.items()}, unindexed or {}, tuple(cartons), (), free, NOW)


def test_plan_unreferenced_respects_grace() -> None:
    s = snap({"a": 10, "b": 20, "m": 1}, [use("m", 0, {"a"})], added=NOW - 100)
    assert plan_collection(s, GcPolicy(grace=50)).unreferenced == {"b"}
    assert plan_collection(s, GcPolicy(grace=500)).unreferenced == set()


def test_plan_evicts_least_recently_used_first() -> None:
    s = snap({"x": 100, "y": 100, "z": 100, "c1": 1, "c2": 1, "c3": 1},
             [use("c1", 30, {"x"}), use("c2", 10, {"y"}), use("c3", 20, {"z"})])
    plan = plan_collection(s, GcPolicy(max_size=210))
    assert plan.evicted_models == ["c2"] and plan.evicted_blobs == {"y"}
    plan = plan_collection(s, GcPolicy(max_size=110))
    assert plan.evicted_models == ["c2", "c3"] and plan.evicted_blobs == {"y", "z"}


def test_plan_never_touches_leased_or_pinned_cartons() -> None:
    s = snap({"x": 100, "y": 100, "c1": 1, "c2": 1}, [use("c1", 1, {"x"}, leased=True), use("c2", 2, {"y"})])
    plan = plan_collection(s, GcPolicy(max_size=0))
    assert plan.evicted_models == ["c2"] and plan.evicted_blobs == {"y"}


def test_plan_keeps_shared_blobs_until_every_lister_is_evicted() -> None:
    s = snap({"shared": 100, "own": 10, "c1": 1, "c2": 1},
             [use("c1", 1, {"shared", "own"}), use("c2", 2, {"shared"}, leased=True)])
    plan = plan_collection(s, GcPolicy(max_size=0))
    assert plan.evicted_blobs == {"own"}


def test_plan_keeps_cartons_known() -> None:
    s = snap({"toml": 5, "w": 100, "c1": 1}, [use("c1", 1, {"toml", "w"}, keep=frozenset({"toml"}))])
    plan = plan_collection(s, GcPolicy(max_size=0))
    assert plan.evicted_blobs == {"w"}  # carton.toml and the MANIFEST (c1) stay


def test_plan_min_free_counts_what_unreferenced_removal_frees() -> None:
    s = snap({"old": 100, "x": 100, "c1": 1}, [use("c1", 1, {"x"})], free=50)
    assert plan_collection(s, GcPolicy(min_free=140, grace=0)).evicted_blobs == set()
    assert plan_collection(s, GcPolicy(min_free=160, grace=0)).evicted_blobs == {"x"}


def test_plan_unindexed_leftovers() -> None:
    s = snap({}, [], unindexed={"left": (10, NOW - 7200), "fresh": (10, NOW - 10)})
    assert plan_collection(s, GcPolicy(grace=3600)).leftovers == {"left"}


def _carton(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    d = tmp_path / name
    for rel, data in {"carton.toml": MINIMAL_TOML.replace(b'"tiny"', f'"{name}"'.encode()), **files}.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


def test_unreferenced_blobs_go_after_the_grace(store: Store, tmp_path: Path) -> None:
    d = store.add(_carton(tmp_path, "a", {"model/w": b"w" * 1000})).digest
    store.remove(d)
    stray = b"added and forgotten"
    with store.blobs.writer() as w:
        w.write(stray)
        staged = w.stage()
    store.blobs.commit(staged)
    store.index.record_blobs([(staged.digest, len(stray))])
    assert store.collect(GcPolicy(grace=3600)).unreferenced_blobs == 0
    report = store.collect(GcPolicy(grace=0))
    assert report.unreferenced_blobs == 1 and not store.blobs.has(staged.digest)
    assert store.verify().ok


def test_budget_eviction_keeps_cartons_known_and_leased_ones(store: Store, tmp_path: Path) -> None:
    old = store.add(_carton(tmp_path, "old", {"model/w": os.urandom(50_000)})).digest
    new = store.add(_carton(tmp_path, "new", {"model/w": os.urandom(50_000)})).digest
    leased = store.add(_carton(tmp_path, "leased", {"model/w": os.urandom(50_000)})).digest
    for d in (old, leased, new):
        store.materialize(d)
        time.sleep(0.01)   # the clock is the subject: each a later last use than the one before
    store.index.create_lease(leased, 60)
    report = store.collect(GcPolicy(max_size=120_000))
    assert report.evicted_models == [old]
    assert not (store.root / "models" / old).exists()
    assert (store.root / "models" / leased).is_dir() and (store.root / "models" / new).is_dir()
    info = store.info(old)
    assert info.missing_blobs and store.config_of(old).model_name == "old"  # still known
    report = store.collect(GcPolicy(max_size=0))
    assert (store.root / "models" / leased).is_dir(), "a leased model is never collected"
    assert report.evicted_models == [new]
    assert store.verify().ok


def test_a_lease_taken_between_turns_keeps_its_blobs(store: Store, tmp_path: Path, monkeypatch) -> None:
    """gc applies its plan in turns, releasing the store lock between them; a
    carton leased after the first turn keeps every blob the plan had doomed."""
    import cartonstore.store.gc.collect as collection

    monkeypatch.setattr(collection, "GC_TURN_SECONDS", 0.0)  # one chunk a turn
    monkeypatch.setattr(collection, "GC_CHUNK", 1)
    added = {n: store.add(_carton(tmp_path, n, {"model/w": os.urandom(5000)})) for n in ("a", "b")}
    weights = {n: next(e.digest for e in store.index.entries(r.digest) if e.path == "model/w")
               for n, r in added.items()}
    first, second = sorted(weights, key=weights.get)
    real_delete = store.blobs.delete
    deleted: list[str] = []

    def delete_then_lease(digest: str) -> None:
        real_delete(digest)
        deleted.append(digest)
        if len(deleted) == 1:  # between this turn and the next one
            store.index.create_lease(added[second].digest, 60)

    monkeypatch.setattr(store.blobs, "delete", delete_then_lease)
    report = store.collect(GcPolicy(max_size=0))
    assert deleted == [weights[first]] and report.evicted_blobs == 1
    assert store.blobs.has(weights[second]) and not store.info(added[second].digest).missing_blobs
    assert store.verify().ok


def test_dry_run_changes_nothing(store: Store, tmp_path: Path) -> None:
    d = store.add(_carton(tmp_path, "a", {"model/w": b"x" * 5000})).digest
    store.materialize(d)
    before = snapshot(store.root)
    report = store.collect(GcPolicy(max_size=0, dry_run=True))
    assert report.dry_run and report.evicted_models == [d] and report.freed_bytes >= 5000
    assert snapshot(store.root) == before


def test_tmp_leftovers_of_dead_processes_only(store: Store, tmp_path: Path) -> None:
    code = ("import os, sys, time\n"
            "from cartonstore.store import Store\n"
            "s = Store(sys.argv[1])\n"
            "w = s.blobs.writer()\n"
            "w.write(b'half a blob')\n"
            "print(w.tmp_path, flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(store.root)], stdout=subprocess.PIPE, text=True)
    left = Path(proc.stdout.readline().strip())
    with store.blobs.writer() as mine:  # ours: alive
        mine.write(b"in progress")
        old = time.time() - 3600
        for p in (left, mine.tmp_path):
            os.utime(p, (old, old))
        assert store.collect().tmp_entries == 0, "a live owner keeps its tmp/ entries"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        report = store.collect()
        assert report.tmp_entries >= 1 and not left.exists()
        assert mine.tmp_path.exists()


def test_cli_gc_runs_in_the_daemon_when_one_serves(daemon, tmp_path: Path, capsys) -> None:
    assert main(["add", str(_carton(tmp_path, "a", {"model/w": b"x" * 100})), "--root", str(daemon.root),
                 "--progress", "none"]) == 0
    capsys.readouterr()
    assert main(["gc", "--root", str(daemon.root), "--socket", str(daemon.socket_path), "--json",
                 "--max-size", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ran_in"] == "daemon" and report["evicted_blobs"] == 1
    with Store(daemon.root) as s:
        digest = s.resolve("a")
    assert report["partial_models"] == [{"manifest_sha256": digest, "names": ["a"]}]
    assert main(["gc", "--root", str(daemon.root), "--local", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ran_in"] == "this process"


def test_cli_gc_counts_the_models_it_made_partial(tmp_path: Path, capsys) -> None:
    """Models never materialized lose their blobs too: the report names them
    (not "evicted: 0 model(s)")."""
    root = str(tmp_path / "root")
    digests = {}
    for n in ("big", "tiny", "kept"):
        files = {"model/w": os.urandom(60_000 if n == "big" else 20_000)}
        assert main(["add", str(_carton(tmp_path, n, files)), "--root", root, "--progress", "none", "--json"]) == 0
        digests[n] = json.loads(capsys.readouterr().out)["manifest_sha256"]
        time.sleep(0.01)   # the clock is the subject: each added later than the one before
    assert main(["gc", "--root", root, "--local", "--max-size", "30K", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would evict 2 blob(s) (78.1 KiB); 2 model(s) would be partial: big, tiny\n" in out
    assert main(["gc", "--root", root, "--local", "--max-size", "30K"]) == 0
    out = capsys.readouterr().out
    assert "evicted 2 blob(s) (78.1 KiB); 2 model(s) now partial: big, tiny\n" in out
    assert "model directory" not in out
    with Store(root) as s:
        assert s.info(digests["big"]).missing_blobs and s.info(digests["tiny"]).missing_blobs
        assert not s.info(digests["kept"]).missing_blobs
    assert main(["gc", "--root", root, "--local", "--json", "--max-size", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["partial_models"] == [{"manifest_sha256": digests["kept"], "names": ["kept"]}]
    assert main(["gc", "--root", root, "--local", "--max-size", "0"]) == 0
    assert "evicted 0 blob(s) (0 B)\n" in capsys.readouterr().out


def test_the_daemon_collects_on_its_own_over_budget(short_tmp: Path, capsys) -> None:
    from kit.daemonkit import DaemonProcess, wait_for

    root = short_tmp / "root"
    assert main(["add", str(_carton(short_tmp, "a", {"model/w": os.urandom(100_000)})), "--root", str(root),
                 "--progress", "none"]) == 0
    assert main(["path", "a", "--root", str(root)]) == 0
    cfg = short_tmp / "cs.toml"
    cfg.write_text('[gc]\nmax_size = "10KiB"\ninterval = "0.2s"\n')
    with DaemonProcess(root, listen=None, extra_args=["--config", str(cfg)]):
        assert wait_for(lambda: not any((root / "models").iterdir()), timeout=15)
    with Store(root) as s:
        assert s.verify().ok and s.info(s.resolve("a")).missing_blobs


def test_evicted_linked_blobs_come_back_on_lease(short_tmp: Path, origin) -> None:
    from kit.daemonkit import DaemonProcess, unix_session
    from kit.fetchkit import linked_carton

    payload = os.urandom(200_000)
    carton, shas = linked_carton(short_tmp, origin, {"model/w.bin": payload})
    root = short_tmp / "root"
    with DaemonProcess(root, listen=None) as d:
        import asyncio

        async def lease() -> dict:
            async with unix_session(d.socket_path) as s, s.post("/v1/leases", json={"model": str(carton), "ttl": 0.5}) as r:
                assert r.status == 200, await r.text()
                return await r.json()

        first = asyncio.run(lease())
        time.sleep(0.6)   # the clock is the subject: the lease's 0.5 s pass
        with Store(root) as s:
            assert s.collect(GcPolicy(max_size=0)).evicted_blobs == 1
        again = asyncio.run(lease())
        assert again["path"] == first["path"]
        assert (Path(again["path"]) / "model" / "w.bin").read_bytes() == payload
        assert origin.count(f"/blobs/{shas['model/w.bin']}") == 2


def test_work_in_tmp_helper_ignores_owner_locks(store: Store) -> None:
    with store.blobs.writer() as w:
        w.write(b"x")
        assert work_in_tmp(store.root) == [w.tmp_path.name]
    assert work_in_tmp(store.root) == [] and sha(b"x")


# -- the daemon's collections run in a child process (server/models/gc_child.py) ------


@pytest.mark.parametrize("returncode, out, err, expected", [
    (0, '{"report": {"dry_run": true, "expired_leases": 2, "freed_bytes": 9}}\n', "", "report"),
    (4, '{"error": "cannot create store at /x: Not a directory", "subject": "/x"}', "", "InvalidInput"),
    (5, '{"error": "blob 3f2a... does not match its digest", "subject": null}', "", "IntegrityError"),
    (6, '{"error": "timed out after 600s waiting for lock s.lock", "subject": null}', "", "Unavailable"),
    (7, '{"error": "held", "subject": null}', "", "Conflict"),
    (-9, "", "", "gc process was killed by signal 9: no output"),
    (1, "", "Traceback ...\nMemoryError\n", "gc process exited 1: MemoryError"),
    (0, "not json at all", "", "gc process exited 0: no output"),
])
def test_the_childs_answer_becomes_a_report_or_the_same_kind_of_error(
        returncode: int, out: str, err: str, expected: str) -> None:
    from cartonstore.errors import CartonStoreError
    from cartonstore.server.models.gc_child import report_from_child

    if expected == "report":
        report = report_from_child(returncode, out, err)
        assert report.dry_run and report.expired_leases == 2 and report.unreferenced_blobs == 0
        return
    with pytest.raises(CartonStoreError) as info:
        report_from_child(returncode, out, err)
    if " " in expected:
        assert str(info.value) == expected and type(info.value).__name__ == "Unavailable"
    else:
        assert type(info.value).__name__ == expected and str(info.value).startswith("gc: ")


def test_a_collection_in_a_child_process_frees_and_reports(store: Store, tmp_path: Path) -> None:
    import asyncio

    from cartonstore.server.models.gc_child import collect_in_child

    store.add(_carton(tmp_path, "a", {"model/w": b"w" * 1000}), name="a")
    dry = asyncio.run(collect_in_child(store.root, GcPolicy(max_size=0, dry_run=True)))
    assert dry.dry_run and dry.evicted_blobs == 1 and store.info(store.resolve("a")).missing_blobs == []
    report = asyncio.run(collect_in_child(store.root, GcPolicy(max_size=0)))
    assert report.evicted_blobs == 1 and report.evicted_bytes == 1000
    assert store.info(store.resolve("a")).missing_blobs and store.verify().ok


def test_a_collection_that_cannot_open_the_store_says_why(tmp_path: Path) -> None:
    import asyncio

    from cartonstore.errors import InvalidInput
    from cartonstore.server.models.gc_child import collect_in_child

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(InvalidInput, match=f"gc: cannot create store at {not_a_dir}"):
        asyncio.run(collect_in_child(not_a_dir, GcPolicy()))
    assert not_a_dir.read_text() == "x"


def _children() -> list[int]:
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (OSError, ValueError):
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me:
            found.append(int(entry))
    return found


def test_a_cancelled_collection_stops_its_child_and_changes_nothing(store: Store, tmp_path: Path) -> None:
    import asyncio

    from cartonstore.server.models.gc_child import collect_in_child

    store.add(_carton(tmp_path, "a", {"model/w": b"w" * 1000}), name="a")
    before = snapshot(store.root)

    async def cancel_while_waiting_for_the_store_lock() -> int:
        # Children this process had already (multiprocessing's resource tracker, after
        # tests that used shared memory) are not the collection's.
        earlier = set(_children())
        task = asyncio.ensure_future(collect_in_child(store.root, GcPolicy(max_size=0)))

        def kids() -> list[int]:
            return [k for k in _children() if k not in earlier]
        lock_file = store.lock().path.resolve()
        assert await wait_for_async(lambda: any(descriptors_of(k, lock_file) for k in kids()), 15)   # waits for the lock
        kid = next(k for k in kids() if descriptors_of(k, lock_file))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return kid

    with store.lock():
        child = asyncio.run(cancel_while_waiting_for_the_store_lock())
    assert not Path(f"/proc/{child}").exists()
    assert snapshot(store.root) == before


def test_a_blob_file_without_its_row_is_adopted_only_between_collection_turns(store: Store,
                                                                              tmp_path: Path) -> None:
    """A collection forgets rows, then unlinks files, in one turn under the
    store lock. A file seen in between is going, not a leftover to adopt:
    missing_blobs waits for the turn and then reports the blob missing (it
    used to adopt a row for a deleted file, or fail on the vanished file)."""
    import threading

    d = store.add(_carton(tmp_path, "m", {"model/w": b"w" * 1000})).digest
    victim = sha(b"w" * 1000)
    results: list[object] = []
    with store.lock():  # what a collection's turn holds
        store.index.forget_blobs([victim])
        waiter = threading.Thread(target=lambda: results.append(store.missing_blobs(d)))
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive(), "adopted a file while a collection held the store lock"
        store.blobs.delete(victim)
    waiter.join(10)
    assert results == [[victim]]
    assert victim not in dict(store.index.blob_rows())
    assert store.verify().ok


def test_a_blob_file_left_without_its_row_is_adopted(store: Store, tmp_path: Path) -> None:
    d = store.add(_carton(tmp_path, "m", {"model/w": b"w" * 1000})).digest
    victim = sha(b"w" * 1000)
    store.index.forget_blobs([victim])  # a crash between the file's rename and its row
    assert store.missing_blobs(d) == []
    assert dict(store.index.blob_rows())[victim] == 1000
