"""Store: the library a user (or the CLI, or the daemon) calls.

Each public method is one operation on a store root. All of them block
(file, hash and SQLite work); async callers run them in worker threads.
Cross-process safety comes from ROOT/locks/: ``store.lock`` is taken
exclusively for the short moments that change which blobs exist (commit,
rm, gc) and shared while a model directory is built from blobs.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..checks import (
    CheckedCarton,
    check_carton,
    check_safetensors,
    compute_manifest,
    is_safetensors,
)
from ..errors import Conflict, InvalidInput, NotFound
from ..format.manifest import is_sha256
from ..sources import DirCartonView, open_local
from ..zipfmt import ZipLimits
from .blobs import BlobStore
from .gc import (
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
from .index import CartonRow, Index
from .ingest import IngestResult, Staging, commit_carton, stage_carton
from .layout import StoreLayout
from .locks import FileLock
from .materialize import build_tree, check_tree, plan_tree, remove_tree
from .names import (
    MIN_PREFIX,
    NameOutcome,
    assign_name,
    check_move,
    default_name,
    removal_refused,
    validate_name,
)
from .owner import tmp_name

# gc holds the store lock for about this long at a time (leases wait on it),
# deleting this many rows and files between looks at the clock.
GC_TURN_SECONDS = 0.002
GC_CHUNK = 16

_HEX = re.compile(r"^[0-9a-f]+$")


@dataclass(frozen=True)
class CartonInfo:
    row: CartonRow
    names: list[str]
    missing_blobs: list[str]
    model_dir: Path | None

    @property
    def complete(self) -> bool:
        return not self.missing_blobs


@dataclass(frozen=True)
class RemoveResult:
    digest: str
    blobs_removed: int
    bytes_freed: int


@dataclass
class VerifyReport:
    blobs_checked: int = 0
    corrupt_blobs: list[str] = field(default_factory=list)
    missing_blobs: list[str] = field(default_factory=list)      # indexed, file gone
    unindexed_blobs: list[str] = field(default_factory=list)    # sound file, no row (crash leftover)
    stray_files: list[str] = field(default_factory=list)        # not named by a digest
    models_checked: int = 0
    damaged_models: dict[str, list[str]] = field(default_factory=dict)
    orphan_models: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.corrupt_blobs or self.missing_blobs or self.damaged_models or self.stray_files)


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


class Store:
    def __init__(self, root: Path | str, *, zip_limits: ZipLimits | None = None) -> None:
        self.zip_limits = zip_limits or ZipLimits()
        self.layout = StoreLayout(Path(root))
        try:
            self.layout.create()
        except OSError as e:
            raise InvalidInput(f"cannot create store at {root}: {e.strerror}", subject=str(root)) from e
        self.blobs = BlobStore(self.layout)
        self.index = Index(self.layout.index_db)

    @property
    def root(self) -> Path:
        return self.layout.root

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lock(self, *, shared: bool = False) -> FileLock:
        return FileLock(self.layout.locks_dir / "store.lock", shared=shared)

    # -- adding --------------------------------------------------------------

    def add(self, source: str | Path, *, name: str | None = None, source_label: str | None = None,
            force: bool = False) -> IngestResult:
        """Ingest a local .carton file or carton directory. Returns once the
        carton is known; raises InvalidCarton (store unchanged) when it is bad.
        An explicit name may move from another carton (result.naming says so)
        unless a daemon has that carton loaded (Conflict, unless force); the
        carton's model_name only names it when that name is free.
        URLs are the fetcher's (cartonstore.fetch.Puller)."""
        text = str(source)
        if "://" in text:
            raise InvalidInput(f"cannot add {text!r} here: URLs are fetched by cartonstore.fetch.Puller "
                               "(the CLI does this for you)", subject=text)
        if name is not None:  # before any work; whether it may move is known at commit
            validate_name(name)
        view = open_local(Path(source), self.zip_limits)
        try:
            raw = view.read_metadata("MANIFEST")
            if raw is None and isinstance(view, DirCartonView):
                raw = compute_manifest(view)
            checked = check_carton(view, manifest_raw=raw)
            staging = stage_carton(checked, view, self.blobs)
        finally:
            view.close()
        return self.commit_checked(checked, staging, name=name, source=source_label or os.path.abspath(text),
                                   force=force)

    def name_carton(self, digest: str, name: str | None, *, force: bool = False) -> NameOutcome:
        """Name a carton already known (its model_name when name is None),
        by the rules of add."""
        if name is not None:
            validate_name(name)
        row = self.index.carton(digest)
        default = default_name(row.model_name) if row is not None else None
        with self.lock(), self.index.transaction() as conn:
            return assign_name(conn, digest, explicit=name, default=default, force=force)

    def commit_checked(self, checked: CheckedCarton, staging: Staging, *, name: str | None,
                       source: str | None, force: bool = False) -> IngestResult:
        """Commit a validated carton and its staged blobs (always discards
        what is left of the staging)."""
        stale = None
        try:
            with self.lock():
                if self.index.carton(checked.digest) is None:
                    # A model directory of a carton the index does not know is a
                    # leftover (of a crash in rm or an older gc): never serve it.
                    stale = self._take_model_away(checked.digest)
                if name is not None:  # before any blob moves: a refusal leaves the store as it was
                    self.index.read(lambda conn: check_move(conn, name, checked.digest, force=force))
                return commit_carton(checked, staging, self.index, self.blobs, name=name, source=source,
                                     force=force)
        finally:
            staging.discard()
            if stale is not None:
                remove_tree(stale)

    # -- finding -------------------------------------------------------------

    def resolve(self, ref: str) -> str:
        """Manifest hash, unique prefix of 8+ hex digits, or name -> manifest hash."""
        ref = ref.strip()
        if is_sha256(ref):
            if self.index.carton(ref):
                return ref
            raise NotFound(f"no carton with manifest hash {ref} in the store", subject=ref)
        by_name = self.index.carton_for_name(ref)
        if by_name:
            return by_name
        if len(ref) >= MIN_PREFIX and _HEX.match(ref):
            found = self.index.cartons_with_prefix(ref)
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise Conflict(f"{ref!r} is ambiguous: it prefixes {', '.join(found)}", subject=ref)
        hint = (f"; a hash prefix needs at least {MIN_PREFIX} hex digits"
                if len(ref) < MIN_PREFIX and _HEX.match(ref) else "")
        raise NotFound(f"no carton matches {ref!r} (not a known manifest hash, hash prefix or name{hint})",
                       subject=ref)

    def resolve_or_add(self, ref: str) -> str:
        """resolve(), and for a REF that is a source (a local path), add it first."""
        try:
            return self.resolve(ref)
        except NotFound:
            if os.path.exists(ref):
                return self.add(ref).digest
            raise

    def info(self, digest: str) -> CartonInfo:
        row = self.index.carton(digest)
        if row is None:
            raise NotFound(f"no carton with manifest hash {digest} in the store", subject=digest)
        model = self.layout.model_path(digest)
        return CartonInfo(row, self.index.names_of(digest), self.index.missing_blobs(digest),
                          model if model.is_dir() else None)

    def list(self) -> list[CartonInfo]:
        return [self.info(r.digest) for r in self.index.cartons()]

    # -- materializing -------------------------------------------------------

    def materialize(self, ref: str) -> Path:
        """The carton's read-only model directory, built on first use."""
        digest = self.resolve_or_add(ref)
        dest = self.layout.model_path(digest)
        if not dest.is_dir():
            with FileLock(self.layout.locks_dir / f"model-{digest}.lock"):
                if not dest.is_dir():
                    self._build_model(digest, dest)
        self.index.touch(digest)
        return dest

    def missing_blobs(self, digest: str) -> list[str]:
        """Blobs the carton lists that the store lacks. A blob file present
        without its row (a crash between rename and index commit) is adopted:
        its name proves its bytes, so the row is simply written now."""
        missing = self.index.missing_blobs(digest)
        if not any(self.blobs.has(d) for d in missing):
            return missing
        # A collection forgets rows and then unlinks their files, both in one
        # turn under the store lock: a file seen without its row may be about
        # to go. Adopt only while no collection runs, looking again.
        with self.lock(shared=True):
            missing = self.index.missing_blobs(digest)
            present = [(d, size) for d in missing if (size := self.blobs.size_if_present(d)) is not None]
            if present:
                self.index.record_blobs(present)
        adopted = {d for d, _ in present}
        return [d for d in missing if d not in adopted]

    def _build_model(self, digest: str, dest: Path) -> None:
        missing = self.missing_blobs(digest)
        if missing:
            raise NotFound(
                f"carton {digest} is missing {len(missing)} blob(s) (e.g. {missing[0]}); "
                "add the carton again from a source that holds them", subject=digest)
        plan = plan_tree(self.index.entries(digest), digest)
        with self.lock(shared=True):
            build_tree(plan, self.blobs.path, self.layout.tmp_dir, dest)

    # -- inspecting ----------------------------------------------------------

    def safetensors_of(self, digest: str) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for e in self.index.entries(digest):
            if e.kind == "file" and is_safetensors(e.path) and self.blobs.has(e.digest):
                p = self.blobs.path(e.digest)
                header = check_safetensors(e.path, lambda p=p: open(p, "rb"), p.stat().st_size)
                out[e.path] = [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}
                               for t in header.tensors]
        return out

    def config_of(self, digest: str):  # noqa: ANN201 - CartonConfig, imported lazily
        from ..format.carton_toml import parse_carton_toml

        entry = next((e for e in self.index.entries(digest) if e.path == "carton.toml"), None)
        if entry is None or not self.blobs.has(entry.digest):
            raise NotFound(f"carton.toml of {digest} is not in the store", subject=digest)
        return parse_carton_toml(self.blobs.path(entry.digest).read_bytes())

    # -- exporting -----------------------------------------------------------

    def export(self, ref: str, out: Path, *, link_prefix: str | None = None, link_min_size: int = 0,
               compression: str = "zstd"):  # noqa: ANN201
        from ..carton_writer import plan_links, write_carton
        from .export_view import StoreCartonView

        digest = self.resolve(ref)
        view = StoreCartonView(self.index, self.blobs, digest)
        checked = check_carton(view, top_level=False)
        links = dict(checked.links)
        if link_prefix:
            links.update(plan_links(checked, url_prefix=link_prefix, min_size=link_min_size))
        return write_carton(out, checked, view, compression=compression, links=links)

    # -- removing ------------------------------------------------------------

    def remove(self, ref: str) -> RemoveResult:
        """Forget a carton, delete its model directory and the blobs no other
        carton lists. Refuses while a live lease holds it."""
        digest = self.resolve(ref)
        with self.lock():
            if leases := self.index.live_leases(digest):
                raise removal_refused(digest, leases)
            orphans = self.index.remove_carton(digest)
            trash = self._take_model_away(digest)
            freed = sum(self.blobs.delete(d) for d in orphans)
        if trash is not None:
            remove_tree(trash)
        return RemoveResult(digest, len(orphans), freed)

    def _take_model_away(self, digest: str) -> Path | None:
        """Rename a model directory into tmp/ (owned by this process) so it
        disappears whole: deleting it in place could leave, after a crash, a
        half-empty directory that the next `path` would serve as it is."""
        model = self.layout.model_path(digest)
        if not model.is_dir():
            return None
        away = tmp_name(self.layout.tmp_dir, "model")
        os.rename(model, away)
        return away

    # -- collecting ------------------------------------------------------------

    def collect(self, policy: GcPolicy | None = None) -> GcReport:
        """Collect garbage (see store/gc.py); with policy.dry_run, only report.

        The snapshot and plan are made without the store lock; under it
        (briefly) the plan is checked against leases and cartons that appeared
        meanwhile, rows are deleted in one transaction, then blob files are
        unlinked and doomed model directories renamed into tmp/; they are
        deleted after the lock is released."""
        policy = policy or GcPolicy()
        now = time.time()
        report = GcReport(dry_run=policy.dry_run)
        for path in tmp_leftovers(self.layout.tmp_dir, now):
            report.tmp_entries += 1
            report.tmp_bytes += size_of(path)
            if not policy.dry_run:
                remove_path(path)
        snap = self._gc_snapshot(now)
        plan = plan_collection(snap, policy)
        with self.lock():
            if policy.dry_run:
                report.expired_leases = self.index.count_expired_leases(now)
            else:
                report.expired_leases = self.index.expire_leases(now)
                self._revalidate(plan, snap, {c.digest for c in snap.cartons})
                self.index.record_blobs([(d, snap.unindexed[d][0]) for d in plan.adopt if self.blobs.has(d)])
        if not policy.dry_run:
            self._apply(plan, snap)
        _fill_report(report, plan, snap, self.index)
        return report

    def _gc_snapshot(self, now: float) -> Snapshot:
        cartons, listed, keep = self.index.carton_listing()
        leased = self.index.leased_cartons(now)
        blobs = self.index.blob_table()
        models = set(os.listdir(self.layout.models_dir)) if self.layout.models_dir.is_dir() else set()
        uses = tuple(CartonUse(c.digest, c.last_used, c.digest in models, c.digest in leased,
                               frozenset(listed.get(c.digest, ())), frozenset(keep.get(c.digest, ())))
                     for c in cartons)
        known = {c.digest for c in cartons}
        return Snapshot(blobs, unindexed_files(self.blobs.iter_digests(), set(blobs), self.blobs.path), uses,
                        tuple(sorted(m for m in models if m not in known and is_sha256(m))),
                        disk_free(self.root), now)

    def _revalidate(self, plan: GcPlan, snap: Snapshot, known: set[str]) -> None:
        """Drop from the plan what became needed since the snapshot: cartons
        leased meanwhile, blobs listed by them or by cartons added meanwhile
        (``known``: the cartons of the snapshot). Called under the store lock,
        once per turn of _apply, so it must cost well under a millisecond."""
        leased = self.index.leased_cartons(time.time())
        newcomers = [d for d in self.index.cartons_added_since(snap.now - 1) if d not in known]
        needed = set(newcomers)
        for carton in leased | set(newcomers):
            needed.update(e.digest for e in self.index.entries(carton))
        plan.evicted_models = [d for d in plan.evicted_models if d not in leased]
        plan.orphan_models = [d for d in plan.orphan_models if d not in needed]
        plan.evicted_blobs -= needed
        plan.unreferenced -= needed
        plan.leftovers -= needed

    def _apply(self, plan: GcPlan, snap: Snapshot) -> None:
        """Apply in turns of about GC_TURN_SECONDS under the store lock, each
        checked again first, so a lease or a commit waits a couple of
        milliseconds, never the whole collection. Model directories renamed
        into tmp/ in a turn are deleted after it, and the WAL is checkpointed
        after it, both outside the lock."""
        known = {c.digest for c in snap.cartons}
        work = [(d, True) for d in plan.evicted_models + plan.orphan_models]
        work += [(d, False) for d in sorted(plan.unreferenced | plan.evicted_blobs | plan.leftovers)]
        done = 0
        with self.index.checkpoints_deferred() as checkpoint:
            while done < len(work):
                with self.lock():
                    self._revalidate(plan, snap, known)
                    done, trash = self._apply_turn(plan, work, done)
                for path in trash:
                    remove_tree(path)
                checkpoint()
                # flock hands nothing over: without a pause this process would
                # take the lock again before a woken waiter gets to run.
                time.sleep(GC_TURN_SECONDS / 2)

    def _apply_turn(self, plan: GcPlan, work: list[tuple[str, bool]], done: int) -> tuple[int, list[Path]]:
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
            self.index.forget_blobs([d for d, is_model in part if not is_model])
            for digest, is_model in part:
                if not is_model:
                    self.blobs.delete(digest)
                elif (away := self._take_model_away(digest)) is not None:
                    trash.append(away)
            if time.monotonic() >= turn_ends:
                break
        return done, trash

    # -- verifying -----------------------------------------------------------

    def verify(self, *, repair: bool = False) -> VerifyReport:
        report = VerifyReport()
        indexed = dict(self.index.blob_rows())
        on_disk = set()
        for name in self.blobs.iter_digests():
            if not is_sha256(name):
                report.stray_files.append(str(self.layout.blobs_dir / name[:2] / name))
                continue
            on_disk.add(name)
            report.blobs_checked += 1
            if self.blobs.rehash(name) != name:
                report.corrupt_blobs.append(name)
            elif name not in indexed:
                report.unindexed_blobs.append(name)
        report.missing_blobs = sorted(set(indexed) - on_disk)
        self._verify_models(report)
        if repair:
            self._repair(report)
        return report

    def _verify_models(self, report: VerifyReport) -> None:
        if not self.layout.models_dir.is_dir():
            return
        from .blobs import hash_file

        for d in sorted(os.listdir(self.layout.models_dir)):
            if not is_sha256(d) or self.index.carton(d) is None:
                report.orphan_models.append(d)
                continue
            report.models_checked += 1
            plan = plan_tree(self.index.entries(d), d)
            problems = check_tree(plan, self.layout.model_path(d), self.blobs.path, hash_file,
                                  frozenset(report.corrupt_blobs))
            if problems:
                report.damaged_models[d] = problems

    def _repair(self, report: VerifyReport) -> None:
        quarantine = self.layout.quarantine_dir
        with self.lock():
            for digest in report.corrupt_blobs:
                quarantine.mkdir(exist_ok=True)
                shutil.move(str(self.blobs.path(digest)), quarantine / f"{digest}.{int(time.time())}")
                self.index.forget_blob(digest)
                report.repaired.append(f"quarantined corrupt blob {digest}")
            for digest in report.missing_blobs:
                self.index.forget_blob(digest)
                report.repaired.append(f"forgot missing blob {digest}")
            trash = [self._take_model_away(d) for d in report.damaged_models]
            report.repaired += [f"removed damaged model directory {d}" for d in report.damaged_models]
        for path in trash:
            if path is not None:
                remove_tree(path)
        for digest in report.damaged_models:
            if not self.index.missing_blobs(digest):
                self.materialize(digest)
                report.repaired.append(f"rebuilt model directory {digest}")
