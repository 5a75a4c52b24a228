"""Bring a carton from a CartonView into the store.

Stage, then commit: every blob the store lacks is streamed into tmp/,
hashed and checked against MANIFEST; safetensors headers are validated;
only when the whole carton has passed are the staged blobs renamed into
blobs/ and the carton recorded in the index, under the store lock. A
carton that fails anywhere leaves the store exactly as it was.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from cartonstore.carton.checks import (
    CheckedCarton,
    check_carton,
    check_safetensors,
    check_top_level,
    compute_manifest,
    is_safetensors,
)
from cartonstore.errors import IntegrityError, InvalidCarton, ManifestMismatch
from cartonstore.sources.view import CartonView
from cartonstore.store.content.blobs import BlobStore, StagedBlob
from cartonstore.store.metadata.index import CartonRecord, CartonRow, Index
from cartonstore.store.metadata.names import NameOutcome, default_name
from cartonstore.store.metadata.source_bytes import SourceBytes
from cartonstore.store.metadata.source_rows import LocalSource

if TYPE_CHECKING:
    from cartonstore.sources.zip_source import ZipCartonView
    from cartonstore.store.content.blobs import BlobWriter
    from cartonstore.store.metadata.adopted_rows import AdoptedBlob


@dataclass(frozen=True)
class IngestResult:
    digest: str
    name: str | None
    complete: bool
    blobs_added: int
    bytes_added: int
    bytes_reused: int
    naming: NameOutcome | None = None


@dataclass(frozen=True)
class Provenance:
    """What a source tells its commit for the store's figures by kind of
    source (store/metadata/source_bytes.py). ``kind``: the source being
    added, one of SOURCE_KINDS ("url" and "oci" here; "hf" and "adopted"
    for the sources of those names): its staged blobs with no origin of
    their own came from it, and the blobs the store already had count as
    reused by it. ``made_here``: digests of files the source generated
    rather than fetched (a MANIFEST or carton.toml written from a file
    list), counted neither way. ``whole``: the source sent every file,
    those the store had too (a server that ignores Range sends the whole
    zip), so nothing was reused."""

    kind: str
    made_here: frozenset[str] = frozenset()
    whole: bool = False


def source_figures(provenance: Provenance, fresh: Mapping[str, StagedBlob],
                   present: Mapping[str, int]) -> list[SourceBytes]:
    """What one commit adds to the figures (pure): the ``fresh`` blobs it
    renamed into place, by the kind each came from, as fetched; the others
    of ``present`` (digest -> size: the carton's blobs the store holds once
    it is committed) as reused by the source's kind."""
    counts: dict[str, list[int]] = {}   # kind -> [fetched bytes, blobs, reused bytes, blobs]

    def count(kind: str, size: int, column: int) -> None:
        row = counts.setdefault(kind, [0, 0, 0, 0])
        row[column] += size
        row[column + 1] += 1

    for digest, staged in fresh.items():
        if digest not in provenance.made_here:
            count(staged.origin or provenance.kind, staged.size, 0)
    for digest, size in present.items():
        if digest not in fresh and digest not in provenance.made_here:
            count(provenance.kind, size, 0 if provenance.whole else 2)
    return [SourceBytes(kind, *row) for kind, row in counts.items()]


STAGE_WORKERS = max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))
"""Files of one carton copied at once: one per core, up to 8 (more streams
than that only share the disk)."""


class Staging:
    """Blobs staged in tmp/ for one carton; discarded unless committed.
    add_from_view may run in several threads at once (one file each)."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs
        self.staged: dict[str, StagedBlob] = {}

    def path_of(self, digest: str) -> Path:
        s = self.staged.get(digest)
        return s.tmp_path if s else self.blobs.path(digest)

    def add_bytes(self, data: bytes, expected: str) -> None:
        with self.blobs.writer(label="meta") as w:
            w.write(data)
            self.staged[expected] = w.stage(expected_digest=expected, expected_size=len(data))

    def add_small(self, files: Mapping[str, bytes]) -> None:
        """Generated files (a carton's carton.toml and MANIFEST, by name)
        staged unless this staging or the store holds their bytes. Blocking:
        call it in a worker thread."""
        for data in files.values():
            digest = hashlib.sha256(data).hexdigest()
            if digest not in self.staged and not self.blobs.has(digest):
                self.add_bytes(data, digest)

    def add_staged(self, staged: StagedBlob) -> None:
        self.staged[staged.digest] = staged

    def add_from_view(self, view: CartonView, path: str, expected: str) -> StagedBlob:
        with self.blobs.writer() as w:
            span = getattr(view, "raw_span", lambda _p: None)(path)
            try:
                if span is not None:
                    _copy_span(w, view, *span)  # type: ignore[arg-type]  # a view with raw spans is a zip's
                else:  # a decoded entry: its declared size is a claim, so no space is reserved on it
                    with view.open(path) as src:
                        w.copy_from(src)
                staged = w.stage(expected_digest=expected)
            except IntegrityError as e:
                raise ManifestMismatch(path, e.message) from None
        self.staged[expected] = staged
        return staged

    def add_hashing(self, view: CartonView, path: str) -> str:
        """Copy a file whose digest is not known yet into tmp/, hashing it in
        the same read; returns its digest. Bytes the store or this staging
        already hold are dropped again. A file whose size differs from the
        one listed changed while it was read: an error."""
        listed = view.files[path].size
        with self.blobs.writer() as w:
            with view.open(path) as src:
                w.copy_from(src)
            if listed is not None and w.size != listed:
                raise IntegrityError(f"{path}: changed while it was read: {listed} bytes when listed, "
                                     f"{w.size} read", subject=path)
            digest = w.digest
            if digest not in self.staged and not self.blobs.has(digest):  # else dropped unsynced
                self.staged[digest] = w.stage(expected_digest=digest)
        return digest

    def discard(self) -> None:
        for s in self.staged.values():
            s.discard()
        self.staged.clear()


def _copy_span(writer: BlobWriter, view: ZipCartonView, offset: int, length: int) -> None:
    # the zip as the view opened it: a file a caller named is never opened again by its path
    with view.raw_file() as f:
        writer.copy_range(f, offset, length)
    if writer.size != length:
        raise InvalidCarton(view.zip_path.name, f"zip is truncated: an entry needs {length} bytes, found {writer.size}")


def stage_carton(checked: CheckedCarton, view: CartonView, blobs: BlobStore,
                 staging: Staging | None = None) -> Staging:
    """Stage what the store lacks (and ``staging`` does not hold yet) and
    validate safetensors; raises on any problem with everything staged so
    far discarded."""
    staging = staging if staging is not None else Staging(blobs)
    try:
        if not blobs.has(checked.digest):
            staging.add_bytes(checked.manifest.raw, checked.digest)
        wanted = [(digest, path) for digest, path in checked.files_by_digest().items()
                  if digest not in staging.staged and not blobs.has(digest)]
        _stage_at_once(staging, view, wanted)
        check_staged_safetensors(checked, staging)
        return staging
    except BaseException:
        staging.discard()
        raise


def _stage_at_once(staging: Staging, view: CartonView, wanted: list[tuple[str, str]]) -> None:
    """Copy several files at once, each read, hashed and written by its own
    worker: sha256 runs on one core per stream (hashlib and file I/O release
    the GIL), so a carton of several large files ingests at the speed of
    several cores, not one. The first failure in file order is raised, once
    every copy already running has ended (so discard() sees all of them)."""
    workers = min(STAGE_WORKERS, len(wanted))
    if workers <= 1:
        for digest, path in wanted:
            staging.add_from_view(view, path, digest)
        return
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cartonstore-ingest")
    try:
        futures = [pool.submit(staging.add_from_view, view, path, digest) for digest, path in wanted]
        for f in futures:
            f.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def stage_unpacked(view: CartonView, blobs: BlobStore) -> tuple[CheckedCarton, Staging]:
    """An unpacked carton without a MANIFEST: each file is read once, staged
    and hashed in the same pass, and MANIFEST is computed from those hashes.
    What check_carton reads again (carton.toml, tensor_data/index.toml,
    string tensors) is compared with MANIFEST there, so a file changed
    meanwhile is caught; the staged bytes are the bytes that were hashed."""
    check_top_level(view, {})  # before any file is read and copied
    staging = Staging(blobs)
    try:
        raw = compute_manifest(view, hash_file=lambda path: staging.add_hashing(view, path))
        checked = check_carton(view, manifest_raw=raw)
    except BaseException:
        staging.discard()
        raise
    return checked, stage_carton(checked, view, blobs, staging)


def check_staged_safetensors(checked: CheckedCarton, staging: Staging) -> None:
    for e in checked.entries:
        if not is_safetensors(e.path):
            continue
        p = staging.path_of(e.digest)
        if not p.exists():
            continue  # linked and not fetched yet: checked when it arrives
        size = p.stat().st_size

        def opener(p: Path = p) -> BinaryIO:
            return open(p, "rb")

        check_safetensors(e.path, opener, size)


def commit_carton(checked: CheckedCarton, staging: Staging, index: Index, blobs: BlobStore,
                  *, name: str | None, source: str | None, force: bool = False,
                  local_sources: Sequence[LocalSource] = (), provenance: Provenance | None = None,
                  adopted: Sequence[AdoptedBlob] = (), default: str | None = None) -> IngestResult:
    """Rename staged blobs into place, then record the carton (and the local
    sources of its blobs, the ``adopted`` files that are now its blobs, and
    with ``provenance`` what it adds to the figures by kind of source, in
    the same transaction). The caller holds the store lock so a collection
    cannot interleave, nor another add put its own inode in a blob's place
    between the look and the row. ``default``: the name it takes when that
    is free and none is given (else one made of its model_name)."""
    fresh: dict[str, int] = {}
    for digest, staged in staging.staged.items():
        blobs.commit(staged)
        fresh[digest] = staged.size
    blobs.sync_dirs(set(fresh))
    sizes = {e.digest: e.size for e in checked.entries if e.size is not None}
    present = [(d, os.stat(blobs.path(d)).st_size) for d in
               {e.digest for e in checked.entries} | {checked.digest} if blobs.has(d)]
    now = time.time()
    total = sum(e.size or 0 for e in checked.entries) if all(e.size is not None or e.kind == "symlink"
                                                         for e in checked.entries) else None
    row = CartonRow(checked.digest, checked.config.model_name, checked.config.runner.runner_name,
                    len(checked.entries), total, source, now, now)
    record = CartonRecord(row, checked.entries, checked.links, local_sources, _still_adopted(blobs, adopted))
    figures = source_figures(provenance, staging.staged, dict(present)) if provenance is not None else []
    naming = index.record_carton(record, blobs=present, name=name,
                                 default_name=default or default_name(checked.config.model_name), force=force,
                                 figures=figures)
    present_set = {d for d, _ in present}
    complete = all(e.digest in present_set for e in checked.entries)
    added = sum(fresh.values())
    reused = sum(sizes.get(d, 0) for d in {e.digest for e in checked.entries} if d not in fresh)
    return IngestResult(checked.digest, naming.name, complete, len(fresh), added, reused, naming)


def _still_adopted(blobs: BlobStore, adopted: Sequence[AdoptedBlob]) -> list[AdoptedBlob]:
    """The adopted files whose inode the blob is once committed (a blob
    another add committed first keeps its own inode, and gets no row)."""
    rows = []
    for row in adopted:
        try:
            st = os.stat(blobs.path(row.digest))
        except FileNotFoundError:
            continue
        if (st.st_dev, st.st_ino) == (row.dev, row.ino):
            rows.append(row)
    return rows
