"""Checking a store against itself (Store.verify): every blob rehashed,
every model directory compared with its carton; --repair quarantines
corrupt blobs, forgets missing ones and rebuilds damaged models.

The scan holds no lock (rehashing a large store takes minutes, and adds,
rm and collections go on meanwhile): the blobs it finds missing or
unindexed are looked at again under the shared store lock, where no rm or
collection is half done, so a blob removed or added with its row during
the scan is no finding.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cartonstore.format.digest import is_sha256
from cartonstore.store.materialize.tree import check_tree, plan_tree, remove_tree

if TYPE_CHECKING:
    from cartonstore.store.gc.parts import StoreParts


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


def verify(store: StoreParts, *, repair: bool = False, rebuild: Callable[[str], object]) -> VerifyReport:
    """Rehash every blob and check every model directory; with ``repair``,
    quarantine what is corrupt and ``rebuild`` (Store.materialize) each
    damaged model directory whose blobs are all there."""
    report = VerifyReport()
    indexed = dict(store.index.blob_rows())
    on_disk = set()
    for name in store.blobs.iter_digests():
        if not is_sha256(name):
            report.stray_files.append(str(store.layout.blobs_dir / name[:2] / name))
            continue
        try:
            actual = store.blobs.rehash(name)
        except FileNotFoundError:  # removed since it was listed (rm, gc): its row is looked at below
            continue
        on_disk.add(name)
        report.blobs_checked += 1
        if actual != name:
            report.corrupt_blobs.append(name)
        elif name not in indexed:
            report.unindexed_blobs.append(name)
    report.missing_blobs = sorted(set(indexed) - on_disk)
    _verify_models(store, report)
    _confirm(store, report)
    if repair:
        _repair(store, report, rebuild)
    return report


def _verify_models(store: StoreParts, report: VerifyReport) -> None:
    if not store.layout.models_dir.is_dir():
        return
    from cartonstore.store.content.hashing import hash_file

    for d in sorted(os.listdir(store.layout.models_dir)):
        if not is_sha256(d) or store.index.carton(d) is None:
            report.orphan_models.append(d)
            continue
        report.models_checked += 1
        plan = plan_tree(store.index.entries(d), d)
        problems = check_tree(plan, store.layout.model_path(d), store.blobs.path, hash_file,
                              frozenset(report.corrupt_blobs))
        if problems:
            report.damaged_models[d] = problems


def _confirm(store: StoreParts, report: VerifyReport) -> None:
    """Keep only the blob findings still true under the shared store lock:
    the rows read before the scan may have gone with their files (rm and gc
    drop rows, then files), a file scanned may have got its row (a commit).
    A store opened read-only is looked at again without the lock (its user
    may not open the lock file for writing)."""
    if not (report.missing_blobs or report.unindexed_blobs):
        return
    with contextlib.nullcontext() if store.index.read_only else store.lock(shared=True):
        rows = {d for d, _ in store.index.blob_rows()}
        report.missing_blobs = [d for d in report.missing_blobs if d in rows and not store.blobs.has(d)]
        report.unindexed_blobs = [d for d in report.unindexed_blobs if d not in rows and store.blobs.has(d)]


def _repair(store: StoreParts, report: VerifyReport, rebuild: Callable[[str], object]) -> None:
    with store.lock():
        for digest in report.corrupt_blobs:
            quarantine_blob(store, digest)
            report.repaired.append(f"quarantined corrupt blob {digest}")
        for digest in report.missing_blobs:
            store.index.forget_blob(digest)
            report.repaired.append(f"forgot missing blob {digest}")
        trash = [store.take_model_away(d) for d in report.damaged_models]
        report.repaired += [f"removed damaged model directory {d}" for d in report.damaged_models]
    for path in trash:
        if path is not None:
            remove_tree(path)
    for digest in report.damaged_models:
        if not store.index.missing_blobs(digest):
            rebuild(digest)
            report.repaired.append(f"rebuilt model directory {digest}")


def quarantine_blob(store: StoreParts, digest: str) -> None:
    """Move a blob whose bytes are not its name's out of blobs/ (kept in
    quarantine/ to be looked at, never served) and forget its row. The
    caller holds the store lock."""
    quarantine = store.layout.quarantine_dir
    quarantine.mkdir(exist_ok=True)
    shutil.move(str(store.blobs.path(digest)), quarantine / f"{digest}.{int(time.time())}")
    store.index.forget_blob(digest)
