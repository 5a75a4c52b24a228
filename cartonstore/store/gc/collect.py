"""Collecting garbage in a store (Store.collect): the plan of store/gc/plan.py,
applied under the store lock in short turns.

The snapshot and plan are made without the lock; each turn checks the plan
again against leases and cartons that appeared meanwhile, deletes rows in
one transaction, then unlinks blob files and moves doomed model directories
into tmp/ (deleted after the turn, outside the lock).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cartonstore.format.digest import is_sha256
from cartonstore.store.content.filespace import shared_bytes
from cartonstore.store.materialize.tree import remove_tree
from cartonstore.store.metadata.adopted_rows import all_adopted
from cartonstore.store.metadata.gc_outcome import GcOutcome
from cartonstore.store.metadata.index import Index
from cartonstore.store.metadata.names import pinned_name

from .holds import drop_leases_of_gone_owners
from .plan import (
    CartonUse,
    GcPlan,
    GcPolicy,
    GcReport,
    Snapshot,
    disk_free,
    made_partial,
    plan_collection,
    remove_path,
    size_of,
    tmp_leftovers,
    unindexed_files,
)

if TYPE_CHECKING:
    from .parts import StoreParts

# gc holds the store lock for about this long at a time (leases wait on it),
# deleting this many rows and files between looks at the clock.
GC_TURN_SECONDS = 0.002
GC_CHUNK = 16


def collect(store: StoreParts, policy: GcPolicy | None = None) -> GcReport:
    """Collect garbage (see store/gc/plan.py); with policy.dry_run, only report.

    The snapshot and plan are made without the store lock; under it
    (briefly) the plan is checked against leases and cartons that appeared
    meanwhile, rows are deleted in one transaction, then blob files are
    unlinked and doomed model directories renamed into tmp/; they are
    deleted after the lock is released."""
    policy = policy or GcPolicy()
    now = time.time()
    report = GcReport(dry_run=policy.dry_run)
    for path in tmp_leftovers(store.layout.tmp_dir, now):
        report.tmp_entries += 1
        report.tmp_bytes += size_of(path)
        if not policy.dry_run:
            remove_path(path)
    orphans = 0
    if not policy.dry_run:  # leases of dead processes, before the snapshot counts them as leases
        with store.lock():
            orphans = drop_leases_of_gone_owners(store)
    snap = _snapshot(store, now, shared=policy.min_free is not None)
    plan = plan_collection(snap, policy)
    with store.lock():
        if policy.dry_run:
            report.expired_leases = store.index.count_expired_leases(now)
        else:
            report.expired_leases = store.index.expire_leases(now) + orphans
            _revalidate(store, plan, snap, {c.digest for c in snap.cartons})
            store.index.record_blobs([(d, snap.unindexed[d][0]) for d in plan.adopt if store.blobs.has(d)])
    names = {d: store.index.names_of(d) for d in (*plan.kept, *plan.forgotten)}  # before rm drops them
    if not policy.dry_run:
        _forget(store, plan, snap)
        _apply(store, plan, snap)
    _fill_report(report, plan, snap, store.index)
    report.kept_unrecoverable = _described(plan.kept, snap, names)
    report.forgotten_models = _described(plan.forgotten, snap, names)
    report.partial_models = [m for m in report.partial_models if m["manifest_sha256"] not in plan.forgotten]
    report.store_bytes_after -= sum(m["bytes"] for m in report.forgotten_models)
    report.over_budget = _over_budget(store, snap, policy, report,
                                      adopted=sum(snap.blobs[d][0] for d in snap.adopted - plan.unreferenced))
    if not policy.dry_run and (policy.max_size is not None or policy.min_free is not None):
        store.index.record_gc_outcome(GcOutcome(time.time(), report.over_budget))
    return report


def _over_budget(store: StoreParts, snap: Snapshot, policy: GcPolicy, report: GcReport, *,
                 adopted: int = 0) -> dict | None:
    """What keeps the store over its budget after this collection: the
    cartons gc may not take (loaded or leased), each with its blobs' bytes.
    None within the budget; ``adopted``: bytes of blobs another tool holds
    (Snapshot.adopted), which max_size does not count."""
    if policy.max_size is not None and report.store_bytes_after - adopted > policy.max_size:
        over = {"setting": "max_size", "limit": policy.max_size, "left": report.store_bytes_after - adopted}
    elif policy.min_free is not None and snap.disk_free + report.freed_bytes < policy.min_free:
        over = {"setting": "min_free", "limit": policy.min_free, "left": snap.disk_free + report.freed_bytes}
    else:
        return None
    held = []
    for carton in (c for c in snap.cartons if c.leased):
        leases = store.index.live_leases(carton.digest, snap.now)
        loaded = sorted({name for lease in leases if (name := pinned_name(lease.id)) is not None})
        held.append({"manifest_sha256": carton.digest, "names": store.index.names_of(carton.digest),
                     "bytes": sum(snap.blobs[d][0] for d in carton.listed if d in snap.blobs), "loaded_as": loaded,
                     "leases": sum(1 for lease in leases if pinned_name(lease.id) is None)})
    return {**over, "held": sorted(held, key=lambda h: (-h["bytes"], h["manifest_sha256"]))}


def _snapshot(store: StoreParts, now: float, *, shared: bool = False) -> Snapshot:
    """What gc plans from; with ``shared``, how much of each blob shares its
    disk blocks (a FIEMAP per blob: only min_free needs it)."""
    cartons, listed, keep = store.index.carton_listing()
    leased = store.index.leased_cartons(now)
    blobs = store.index.blob_table()
    models = set(os.listdir(store.layout.models_dir)) if store.layout.models_dir.is_dir() else set()
    uses = tuple(CartonUse(c.digest, c.last_used, c.digest in models, c.digest in leased,
                           frozenset(listed.get(c.digest, ())), frozenset(keep.get(c.digest, ())))
                 for c in cartons)
    known = {c.digest for c in cartons}
    return Snapshot(blobs, unindexed_files(store.blobs.iter_digests(), set(blobs), store.blobs.path), uses,
                    tuple(sorted(m for m in models if m not in known and is_sha256(m))),
                    disk_free(store.root), now, store.index.unsourced_blobs(blobs),
                    {d: n for d in blobs if (n := shared_bytes(store.blobs.path(d)))} if shared else {},
                    frozenset(_held_by_their_tool(store)))



def _held_by_their_tool(store: StoreParts) -> list[str]:
    """The adopted blobs whose file is still the blob's inode under the path
    it was adopted from (Snapshot.adopted)."""
    held = []
    for row in store.index.read(all_adopted):
        try:
            theirs, ours = os.lstat(row.path), os.stat(store.blobs.path(row.digest))
        except OSError:
            continue
        if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino) == (row.dev, row.ino):
            held.append(row.digest)
    return held

def _revalidate(store: StoreParts, plan: GcPlan, snap: Snapshot, known: set[str]) -> None:
    """Drop from the plan what became needed since the snapshot: cartons
    leased meanwhile, blobs listed by them or by cartons added meanwhile
    (``known``: the cartons of the snapshot). Called under the store lock,
    once per turn of _apply, so it must cost well under a millisecond."""
    leased = store.index.leased_cartons(time.time())
    newcomers = [d for d in store.index.cartons_added_since(snap.now - 1) if d not in known]
    needed = set(newcomers)
    for carton in leased | set(newcomers):
        needed.update(e.digest for e in store.index.entries(carton))
    plan.evicted_models = [d for d in plan.evicted_models if d not in leased]
    for d in list(plan.forgotten):
        # added again (a new source, maybe) or used since the snapshot: not forgotten after all
        row = store.index.carton(d)
        if d in leased or (row is not None and row.last_used > snap.now):
            del plan.forgotten[d]
    plan.orphan_models = [d for d in plan.orphan_models if d not in needed]
    plan.evicted_blobs -= needed
    plan.unreferenced -= needed
    plan.leftovers -= needed


def _forget(store: StoreParts, plan: GcPlan, snap: Snapshot) -> None:
    """--forget-unrecoverable: each planned carton is removed whole, as by
    rm (one carton a turn under the store lock, checked again first); the
    blobs no other carton lists go with it."""
    known = {c.digest for c in snap.cartons}
    for digest in list(plan.forgotten):
        with store.lock():
            _revalidate(store, plan, snap, known)
            if digest not in plan.forgotten:
                continue
            orphans = store.index.remove_carton(digest)
            trash = store.take_model_away(digest)
            for d in orphans:
                store.blobs.delete(d)
        if trash is not None:
            remove_tree(trash)


def _described(cartons: dict[str, set[str]], snap: Snapshot, names: dict[str, list[str]]) -> list[dict]:
    return [{"manifest_sha256": d, "names": names.get(d, []), "blobs": len(blobs),
             "bytes": sum(snap.blobs[b][0] for b in blobs)} for d, blobs in cartons.items()]


def _apply(store: StoreParts, plan: GcPlan, snap: Snapshot) -> None:
    """Apply in turns of about GC_TURN_SECONDS under the store lock, each
    checked again first, so a lease or a commit waits a couple of
    milliseconds, never the whole collection. Model directories renamed
    into tmp/ in a turn are deleted after it, and the WAL is checkpointed
    after it, both outside the lock."""
    known = {c.digest for c in snap.cartons}
    work = [(d, True) for d in plan.evicted_models + plan.orphan_models]
    work += [(d, False) for d in sorted(plan.unreferenced | plan.evicted_blobs | plan.leftovers)]
    done = 0
    with store.index.checkpoints_deferred() as checkpoint:
        while done < len(work):
            with store.lock():
                _revalidate(store, plan, snap, known)
                done, trash = _apply_turn(store, plan, work, done)
            for path in trash:
                remove_tree(path)
            checkpoint()
            # flock hands nothing over: without a pause this process would
            # take the lock again before a woken waiter gets to run.
            time.sleep(GC_TURN_SECONDS / 2)


def _apply_turn(store: StoreParts, plan: GcPlan, work: list[tuple[str, bool]], done: int) -> tuple[int, list[Path]]:
    """Under the store lock: work from ``done`` on, in chunks (rows first,
    one transaction, then files), until the turn's time is up. Returns
    how far it got and the model directories it moved away."""
    models = set(plan.evicted_models) | set(plan.orphan_models)
    trash: list[Path] = []
    turn_ends = time.monotonic() + GC_TURN_SECONDS
    while done < len(work):
        part = [(d, is_model) for d, is_model in work[done:done + GC_CHUNK]
                if (d in models if is_model else
                    d in plan.unreferenced or d in plan.evicted_blobs or d in plan.leftovers)]
        done += GC_CHUNK
        store.index.forget_blobs([d for d, is_model in part if not is_model])
        for digest, is_model in part:
            if not is_model:
                store.blobs.delete(digest)
            elif (away := store.take_model_away(digest)) is not None:
                trash.append(away)
        if time.monotonic() >= turn_ends:
            break
    return done, trash


def _fill_report(report: GcReport, plan: GcPlan, snap: Snapshot, index: Index) -> None:
    report.store_bytes_before = sum(size for size, _ in snap.blobs.values())
    report.unreferenced_blobs = len(plan.unreferenced) + len(plan.leftovers)
    report.unreferenced_bytes = (sum(snap.blobs[d][0] for d in plan.unreferenced)
                                 + sum(snap.unindexed[d][0] for d in plan.leftovers))
    report.evicted_models = list(plan.evicted_models)
    report.evicted_blobs = len(plan.evicted_blobs)
    report.evicted_bytes = sum(snap.blobs[d][0] for d in plan.evicted_blobs)
    report.partial_models = [{"manifest_sha256": d, "names": index.names_of(d)}
                             for d in made_partial(snap, plan.evicted_blobs)]
    report.store_bytes_after = (report.store_bytes_before - report.evicted_bytes
                                - sum(snap.blobs[d][0] for d in plan.unreferenced))
