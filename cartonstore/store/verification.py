"""Checking a store against itself (Store.verify): every blob rehashed,
every model directory compared with its carton; --repair quarantines
corrupt blobs, forgets missing ones and rebuilds damaged models."""

from __future__ import annotations

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
        on_disk.add(name)
        report.blobs_checked += 1
        if store.blobs.rehash(name) != name:
            report.corrupt_blobs.append(name)
        elif name not in indexed:
            report.unindexed_blobs.append(name)
    report.missing_blobs = sorted(set(indexed) - on_disk)
    _verify_models(store, report)
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


def _repair(store: StoreParts, report: VerifyReport, rebuild: Callable[[str], object]) -> None:
    quarantine = store.layout.quarantine_dir
    with store.lock():
        for digest in report.corrupt_blobs:
            quarantine.mkdir(exist_ok=True)
            shutil.move(str(store.blobs.path(digest)), quarantine / f"{digest}.{int(time.time())}")
            store.index.forget_blob(digest)
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
