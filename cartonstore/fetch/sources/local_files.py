"""Evicted blobs back from the local files they were added from.

Each blob's local sources (store/metadata/local_sources.py: a .carton's entry, or a file
of an unpacked directory) are tried most recent first. A file that is gone
or whose size or mtime differ from what was recorded is skipped with the
reason; the bytes of one that looks unchanged are staged, hashed and
accepted only if they match the blob's name (like any fetch), then
committed as BlobFetcher commits a download. Blocking: run it in a worker
thread (Puller.complete does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from cartonstore.carton.checks import check_safetensors, is_safetensors
from cartonstore.errors import CartonStoreError, IntegrityError
from cartonstore.sources import ZipCartonView
from cartonstore.store import Store
from cartonstore.store.content.blobs import StagedBlob
from cartonstore.store.metadata.local_sources import LocalSource, stale_reason
from cartonstore.store.root.locks import FileLock


def restore_from_local(store: Store, digests: Iterable[str], commit: Callable[[StagedBlob], None], *,
                       lock_timeout: float = 600.0) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Bring back what the local sources of ``digests`` still hold. Returns
    the blobs that came back (digest -> size), and for each blob that did
    not but had local sources, why each was skipped."""
    restored: dict[str, int] = {}
    reasons: dict[str, list[str]] = {}
    zips: dict[str, _ZipSource] = {}
    try:
        for digest in digests:
            sources = store.index.local_sources_for(digest)
            if not sources or store.blobs.has(digest):
                continue
            with FileLock(store.layout.locks_dir / f"blob-{digest}.lock", timeout=lock_timeout):
                if store.blobs.has(digest):  # another process brought it meanwhile
                    continue
                why = []
                for src in sources:
                    outcome = stale_reason(src) or _restore_one(store, src, zips, commit)
                    if isinstance(outcome, int):
                        restored[digest] = outcome
                        break
                    why.append(outcome)
                else:
                    reasons[digest] = why
    finally:
        for z in zips.values():
            z.view.close()
    return restored, reasons


def _restore_one(store: Store, src: LocalSource, zips: dict[str, _ZipSource],
                 commit: Callable[[StagedBlob], None]) -> int | str:
    """Stage, verify and commit the blob from one source: its size, or the
    reason it could not."""
    try:
        with store.blobs.writer(label="local") as w:
            if src.in_zip:
                if src.path not in zips:
                    zips[src.path] = _ZipSource(ZipCartonView(Path(src.path), store.zip_limits))
                view, path = zips[src.path].view, zips[src.path].by_member.get(src.member)
                e = view.entry(path) if path is not None else None
                if e is None or (e.local_header_offset, e.compressed_size, e.method) != (
                        src.header_offset, src.compressed_size, src.method):
                    return f"{src.describe()}: the entry is no longer where it was recorded"
                with view.open(path) as stream:  # type: ignore[arg-type]  # e: path is set
                    w.copy_from(stream)
            else:
                with open(src.path, "rb") as f:
                    w.copy_from(f)
            staged = w.stage(expected_digest=src.digest)
    except IntegrityError as e:
        return f"{src.describe()}: its bytes no longer match the blob ({e.message})"
    except CartonStoreError as e:
        return f"{src.describe()}: {e}"
    except OSError as e:
        return f"{src.describe()}: cannot read it: {e.strerror or e}"
    try:
        for path in store.index.paths_of_blob(staged.digest):
            if is_safetensors(path):
                check_safetensors(path, lambda: open(staged.tmp_path, "rb"), staged.size)  # noqa: SIM115 - the check closes it
        commit(staged)
    finally:
        staged.discard()
    return staged.size


class _ZipSource:
    """A .carton opened once for all the blobs read from it."""

    def __init__(self, view: ZipCartonView) -> None:
        self.view = view
        self.by_member = {view.entry(p).name: p for p in view.files}
