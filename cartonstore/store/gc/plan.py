"""Garbage collection: what may go (a pure plan), then removing it.

The mark step is a pure function of a snapshot of the index and the disk
(containerd's design): ``plan_collection`` decides; ``collect`` takes the
snapshot and applies the plan under the exclusive store lock, deleting
index rows in one transaction and only then unlinking files. Nothing a
live lease or a loaded model (a pin is a lease) needs is ever in a plan.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cartonstore.format.digest import is_sha256
from cartonstore.store.materialize.tree import remove_tree
from cartonstore.store.root.owner import owner_is_gone, token_of

TMP_MIN_AGE = 60.0          # a tmp/ entry younger than this may not hold its owner's lock yet
UNOWNED_TMP_MAX_AGE = 86400.0  # entries with no owner token at all (older versions, strays)


@dataclass(frozen=True)
class GcPolicy:
    max_size: int | None = None   # bytes of blobs the store may hold
    min_free: int | None = None   # bytes that must stay free on the store's filesystem
    grace: float = 3600.0         # unreferenced blobs younger than this are kept
    dry_run: bool = False
    # a carton whose blobs eviction would take but that has no source to
    # fetch them again: removed whole (like rm) instead of kept
    forget_unrecoverable: bool = False


@dataclass(frozen=True)
class CartonUse:
    digest: str
    last_used: float
    materialized: bool
    leased: bool
    listed: frozenset[str]        # blobs its MANIFEST lists
    keep: frozenset[str]          # blobs that keep it known: MANIFEST and carton.toml


@dataclass(frozen=True)
class Snapshot:
    blobs: dict[str, tuple[int, float]]      # indexed: digest -> (size, added_at)
    unindexed: dict[str, tuple[int, float]]  # files in blobs/ without a row: digest -> (size, mtime)
    cartons: tuple[CartonUse, ...]
    orphan_models: tuple[str, ...]           # models/ dirs of cartons the index does not know
    disk_free: int
    now: float
    # blobs with no way back once evicted (no LINKS URL, carton URL or live
    # local source): eviction never takes them (store/metadata/local_sources.py)
    unsourced: frozenset[str] = frozenset()
    # blob -> bytes of it whose blocks another file shares (a reflink of the
    # zip it was added from, filespace.shared_bytes): evicting it frees only
    # the rest on disk. Read only when min_free is set.
    shared: dict[str, int] = field(default_factory=dict)
    # adopted blobs whose file the other tool still holds (the same inode,
    # store/adoption.py): removing one frees nothing, and bringing it back
    # from that file would copy it; eviction never takes them, and max_size
    # does not count them
    adopted: frozenset[str] = frozenset()

    def disk_bytes(self, digest: str) -> int:
        """What removing an indexed blob frees on disk."""
        if digest in self.adopted:
            return 0
        size = self.blobs[digest][0]
        return size - min(size, self.shared.get(digest, 0))


@dataclass
class GcPlan:
    unreferenced: set[str] = field(default_factory=set)   # indexed blobs no carton lists
    leftovers: set[str] = field(default_factory=set)      # unindexed blob files no carton lists
    adopt: set[str] = field(default_factory=set)          # unindexed blob files a carton lists
    evicted_models: list[str] = field(default_factory=list)
    evicted_blobs: set[str] = field(default_factory=set)
    orphan_models: list[str] = field(default_factory=list)
    kept: dict[str, set[str]] = field(default_factory=dict)       # carton -> blobs kept: no source
    forgotten: dict[str, set[str]] = field(default_factory=dict)  # carton removed whole -> blobs it frees


@dataclass
class GcReport:
    dry_run: bool = False
    expired_leases: int = 0
    unreferenced_blobs: int = 0
    unreferenced_bytes: int = 0
    tmp_entries: int = 0
    tmp_bytes: int = 0
    evicted_models: list[str] = field(default_factory=list)   # model directories removed
    evicted_blobs: int = 0
    evicted_bytes: int = 0
    # cartons that lost blobs to eviction (still known, fetched again on use):
    # [{"manifest_sha256": ..., "names": [...]}]
    partial_models: list[dict] = field(default_factory=list)
    store_bytes_before: int = 0
    store_bytes_after: int = 0
    # what eviction left because nothing could bring it back, and (with
    # forget_unrecoverable) the cartons removed whole instead:
    # [{"manifest_sha256", "names", "blobs", "bytes"}]
    kept_unrecoverable: list[dict] = field(default_factory=list)
    forgotten_models: list[dict] = field(default_factory=list)
    # the store still over max_size (or the disk under min_free) after this
    # collection, and the cartons gc may not take that hold it there:
    # {"setting", "limit", "left", "held": [{"manifest_sha256", "names", "bytes", "loaded_as", "leases"}]}
    over_budget: dict | None = None

    @property
    def freed_bytes(self) -> int:
        return (self.unreferenced_bytes + self.tmp_bytes + self.evicted_bytes
                + sum(m["bytes"] for m in self.forgotten_models))

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["freed_bytes"] = self.freed_bytes
        return d


def made_partial(snap: Snapshot, evicted_blobs: set[str]) -> list[str]:
    """The cartons that lose at least one of their blobs to eviction."""
    return [c.digest for c in snap.cartons if c.listed & evicted_blobs]


def eviction_summary(report: dict) -> str:
    """One line on eviction, for the CLI and the daemon's log: "evicted 13
    blob(s) (41.4 MiB); 2 model(s) now partial: big, tiny"."""
    from cartonstore.format.units import format_size

    dry = report.get("dry_run", False)
    line = (f"{'would evict' if dry else 'evicted'} {report['evicted_blobs']} blob(s) "
            f"({format_size(report['evicted_bytes'])})")
    partial = report.get("partial_models") or []
    if partial:
        labels = ", ".join(",".join(m["names"]) or m["manifest_sha256"][:12] for m in partial)
        line += f"; {len(partial)} model(s) {'would be' if dry else 'now'} partial: {labels}"
    if report["evicted_models"]:
        line += f"; {len(report['evicted_models'])} model directory(ies) {'would be ' if dry else ''}removed"
    return line


def budget_lines(report: dict) -> list[str]:
    """When the store stays over its budget: a line saying so, and one per
    carton that holds it there ("tiny 1.4 MiB: loaded as tiny")."""
    from cartonstore.format.units import format_size

    over = report.get("over_budget")
    if not over:
        return []
    stays = "would stay" if report.get("dry_run") else "stays"
    if over["setting"] == "max_size":
        head = (f"the store {stays} over its budget: {format_size(over['left'])} of blobs, max_size "
                f"{format_size(over['limit'])}")
    else:
        head = (f"the disk {stays} under its budget: {format_size(over['left'])} free, min_free "
                f"{format_size(over['limit'])}")
    if not over["held"]:
        return [f"{head}; what is left keeps cartons known (MANIFEST, carton.toml) or has no source to fetch it "
                "again"]
    lines = [f"{head}; gc never takes what is loaded or leased:"]
    for held in over["held"]:
        why = [f"loaded as {', '.join(held['loaded_as'])}"] if held["loaded_as"] else []
        why += [f"{held['leases']} lease(s)"] if held["leases"] else []
        label = ",".join(held["names"]) or held["manifest_sha256"][:12]
        lines.append(f"  {label} {format_size(held['bytes'])}: {', '.join(why)}")
    return lines


def unrecoverable_lines(report: dict) -> list[str]:
    """A line per carton whose blobs gc kept for lack of a source ("kept: 2
    blob(s) (5.0 MiB) of model X: no source to fetch them again"), and per
    carton it forgot instead (--forget-unrecoverable)."""
    from cartonstore.format.units import format_size

    def label(m: dict) -> str:
        return ",".join(m["names"]) or m["manifest_sha256"][:12]

    dry = report.get("dry_run", False)
    lines = [f"{'would keep' if dry else 'kept'}: {m['blobs']} blob(s) ({format_size(m['bytes'])}) of model "
             f"{label(m)}: no source to fetch them again (--forget-unrecoverable removes it)"
             for m in report.get("kept_unrecoverable") or []]
    lines += [f"{'would forget' if dry else 'forgot'} model {label(m)} ({m['manifest_sha256']}, {m['blobs']} "
              f"blob(s), {format_size(m['bytes'])}): no source to fetch its blobs again"
              for m in report.get("forgotten_models") or []]
    return lines


def plan_collection(snap: Snapshot, policy: GcPolicy) -> GcPlan:
    """Decide what goes. Pure: the snapshot in, a plan out."""
    plan = GcPlan(orphan_models=list(snap.orphan_models))
    listed = set().union(*(c.listed | {c.digest} for c in snap.cartons)) if snap.cartons else set()
    old = snap.now - policy.grace
    plan.unreferenced = {d for d, (_s, added) in snap.blobs.items() if d not in listed and added < old}
    plan.leftovers = {d for d, (_s, mtime) in snap.unindexed.items() if d not in listed and mtime < old}
    # A crash between a rename and its row (or a row's deletion and the
    # unlink) leaves a sound file without a row; one a carton lists gets its row back.
    plan.adopt = {d for d in snap.unindexed if d in listed}
    leftover = sum(snap.unindexed[d][0] for d in plan.leftovers)
    size = (sum(s for d, (s, _) in snap.blobs.items() if d not in snap.adopted)
            - sum(snap.blobs[d][0] for d in plan.unreferenced - snap.adopted) - leftover)
    over = size - policy.max_size if policy.max_size is not None else 0
    free = snap.disk_free + leftover + sum(snap.disk_bytes(d) for d in plan.unreferenced)
    short = policy.min_free - free if policy.min_free is not None else 0
    if over > 0 or short > 0:
        _evict(snap, plan, over, short, forget=policy.forget_unrecoverable)
    return plan


def _evict(snap: Snapshot, plan: GcPlan, over: int, short: int, *, forget: bool = False) -> None:
    """Least recently used first, cartons whose blobs can all be fetched
    again before the others; a blob goes once no carton left standing lists
    it, and only if it has a source (snap.unsourced). A carton that would
    lose a blob with no source keeps it (plan.kept), or with ``forget`` is
    removed whole (plan.forgotten: the blobs no other carton lists go).
    ``over``: bytes of blobs beyond max_size; ``short``: disk bytes missing
    for min_free. A carton whose blobs would free no disk space (they share
    the blocks of the zips they came from) is left alone when only disk
    space is short; an adopted blob another tool holds stays (snap.adopted)."""
    listers: dict[str, set[str]] = {}
    for c in snap.cartons:
        for d in c.listed | {c.digest}:
            listers.setdefault(d, set()).add(c.digest)
    refs: dict[str, int] = {}
    for c in snap.cartons:
        for d in c.listed:
            refs[d] = refs.get(d, 0) + 1
    protected = set().union(*(c.keep | {c.digest} for c in snap.cartons))
    protected |= set().union(*(c.listed for c in snap.cartons if c.leased)) if snap.cartons else set()
    gone = plan.unreferenced | plan.leftovers

    def recoverable(c: CartonUse) -> bool:
        return not (c.listed - c.keep - {c.digest}) & snap.unsourced

    for c in sorted((c for c in snap.cartons if not c.leased),
                    key=lambda c: (not recoverable(c), c.last_used, c.digest)):
        if over <= 0 and short <= 0:
            break
        if over <= 0 and not any(snap.disk_bytes(d) for d in c.listed if refs[d] == 1 and d not in protected
                                 and d not in gone and d in snap.blobs):
            continue
        freed_here = 0
        stuck = set()
        for d in c.listed:
            refs[d] -= 1
            if refs[d] == 0 and d not in protected and d not in gone and d in snap.blobs:
                if d in snap.adopted:
                    continue
                if d in snap.unsourced:
                    stuck.add(d)
                    continue
                plan.evicted_blobs.add(d)
                gone.add(d)
                freed_here += snap.blobs[d][0]
                short -= snap.disk_bytes(d)
        if stuck and forget:
            forgotten = set(plan.forgotten) | {c.digest}
            frees = {d for d in c.listed | {c.digest} if d in snap.blobs and d not in gone
                     and listers[d] <= forgotten}
            plan.forgotten[c.digest] = frees
            gone |= frees
            freed_here += sum(snap.blobs[d][0] for d in frees)
            short -= sum(snap.disk_bytes(d) for d in frees)
        elif stuck:
            plan.kept[c.digest] = stuck
            if c.materialized and freed_here:  # hardlinks in it would keep the evicted bytes on disk
                plan.evicted_models.append(c.digest)
        elif c.materialized:
            plan.evicted_models.append(c.digest)
        over -= freed_here


def tmp_leftovers(tmp_dir: Path, now: float) -> list[Path]:
    """tmp/ entries whose owner is gone (and owner locks nobody holds)."""
    out: list[Path] = []
    if not tmp_dir.is_dir():
        return out
    for entry in os.scandir(tmp_dir):
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        token = token_of(entry.name)
        if token is None:
            if age > UNOWNED_TMP_MAX_AGE:
                out.append(Path(entry.path))
        elif age > TMP_MIN_AGE and owner_is_gone(tmp_dir, token):
            out.append(Path(entry.path))
    return out


def size_of(path: Path) -> int:
    if path.is_dir() and not path.is_symlink():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    try:
        return path.lstat().st_size
    except FileNotFoundError:
        return 0


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        remove_tree(path)
    else:
        path.unlink(missing_ok=True)


def disk_free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def unindexed_files(blob_names: Iterable[str], indexed: set[str],
                    path_of: Callable[[str], Path]) -> dict[str, tuple[int, float]]:
    out = {}
    for name in blob_names:
        if is_sha256(name) and name not in indexed:
            try:
                st = os.stat(path_of(name))
            except FileNotFoundError:
                continue
            out[name] = (st.st_size, st.st_mtime)
    return out


