"""Adopting files another tool keeps (``cartonstore adopt``): a Hugging
Face cache repository, an Ollama models directory, a directory of model
files (sources/adoptable.py reads which files and what their names claim),
stored as cartons without a second copy of their bytes.

Each file is hashed in a worker thread and checked against the hash its
name claims; then hard-linked into tmp/ as its blob (one inode for both
tools), or, on another filesystem, written there by copy_range (reflinked
where the filesystem shares blocks, copied otherwise, and the result says
how many bytes were copied). Nothing is committed until every file of
every model is verified and every carton checked: bad input discards what
was staged and leaves the store as it was. Each model is then committed in
its own transaction, so a failure of the store itself (a full disk) at one
model leaves the models before it committed, and its error names them.

A linked file is made read-only (BLOB_MODE, as every blob is): the other
tool reads it and replaces its files by renaming new ones over them
(huggingface_hub, Ollama), which leaves the store's inode alone; a write in
place through the other path would change the blob itself. Its size, mtime
and inode are recorded (metadata/adopted_rows.py), which adopted_check.py
compares before a model directory is handed out.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cartonstore.carton.checks import CheckedCarton, check_carton
from cartonstore.carton.from_files import ListedFile, files_carton
from cartonstore.carton.from_model import runnable_files_carton
from cartonstore.errors import CartonStoreError, IntegrityError, InvalidInput, PermissionDenied, Unavailable
from cartonstore.sources.adoptable import AdoptableFile, AdoptableModel, read_adoptable
from cartonstore.store.content.blobs import BLOB_MODE, StagedBlob
from cartonstore.store.content.filespace import shared_bytes
from cartonstore.store.content.hashing import CHUNK, git_blob, sha256
from cartonstore.store.metadata.adopted_rows import AdoptedBlob
from cartonstore.store.metadata.names import NameOutcome, default_name, validate_name
from cartonstore.store.metadata.source_rows import LocalSource
from cartonstore.store.root.owner import tmp_name

from .ingest import STAGE_WORKERS, IngestResult, Provenance, Staging, check_staged_safetensors

if TYPE_CHECKING:
    from cartonstore.store.gc.parts import StoreParts

    Commit = Callable[..., IngestResult]

LINK_REFUSED = frozenset({errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP})
"""link() errors after which the file is copied instead (another mount, a
link-count limit, protected_hardlinks, a filesystem without links)."""

ADOPT_SUFFIX = "-adopt"
"""How a file linked into tmp/ by adopt is named (after tmp_name's)."""


@dataclass(frozen=True)
class LinkedBlob(StagedBlob):
    """A file hard-linked into tmp/: discarding it unlinks the store's name
    and gives the file back the mode it had, unless another store path
    shares the inode (``blob_path``, where another adopt of the file
    committed it, or another adopt's link in tmp/): the inode is a blob
    then, and keeps the blob's mode."""

    mode: int = 0
    blob_path: Path | None = None

    def discard(self) -> None:
        try:
            st = os.lstat(self.tmp_path)
        except FileNotFoundError:
            return
        if not self._shared_in_store(st):
            os.chmod(self.tmp_path, self.mode)
        super().discard()

    def _shared_in_store(self, st: os.stat_result) -> bool:
        others = [self.blob_path] if self.blob_path is not None else []
        with os.scandir(self.tmp_path.parent) as entries:
            others += [Path(e.path) for e in entries if e.name.endswith(ADOPT_SUFFIX) and e.path != str(self.tmp_path)]
        for other in others:
            try:
                o = os.lstat(other)
            except FileNotFoundError:
                continue
            if (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino):
                return True
        return False


@dataclass(frozen=True)
class AdoptedModel:
    digest: str
    model_name: str
    origin: str
    files: int
    size: int
    naming: NameOutcome | None

    def as_json(self) -> dict:
        return {"manifest_sha256": self.digest, "model_name": self.model_name, "adopted_from": self.origin,
                "name": self.naming.name if self.naming else None, "files": self.files, "size": self.size}


@dataclass
class AdoptResult:
    models: list[AdoptedModel] = field(default_factory=list)
    files_linked: int = 0
    bytes_linked: int = 0
    files_copied: int = 0      # another filesystem: written into the store (reflinked where it could)
    bytes_copied: int = 0      # of those, the bytes copied (not reflinked)
    bytes_reflinked: int = 0
    files_present: int = 0     # the store had the bytes already
    bytes_present: int = 0

    def as_json(self) -> dict:
        return {"models": [m.as_json() for m in self.models],
                **{k: getattr(self, k) for k in ("files_linked", "bytes_linked", "files_copied", "bytes_copied",
                                                 "bytes_reflinked", "files_present", "bytes_present")}}


class _Staged:
    """Every file of one adopt, verified and staged in tmp/ (or found in the store)."""

    def __init__(self, store: StoreParts, result: AdoptResult) -> None:
        self.store = store
        self.staging = Staging(store.blobs)
        self.result = result
        self.adopted: dict[str, AdoptedBlob] = {}
        self.local: dict[str, LocalSource] = {}
        self._tmp_dev = os.stat(store.layout.tmp_dir).st_dev
        self._lock = threading.Lock()

    def take_all(self, files: Sequence[AdoptableFile]) -> dict[Path, ListedFile]:
        """Each distinct file staged once, several at a time; the first
        failure, in order, raised once every worker has ended."""
        unique = list({f.disk: f for f in files}.values())
        pool = ThreadPoolExecutor(max_workers=max(1, min(STAGE_WORKERS, len(unique))),
                                  thread_name_prefix="cartonstore-adopt")
        try:
            futures = [pool.submit(self._take, f) for f in unique]
            return {f.disk: future.result() for f, future in zip(unique, futures, strict=True)}
        finally:   # after a failure, the files not started are not read at all
            pool.shutdown(wait=True, cancel_futures=True)

    def _take(self, f: AdoptableFile) -> ListedFile:
        try:
            fd = os.open(f.disk, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except PermissionError:
            raise PermissionDenied(f"{f.path}: this user may not read {f.disk}; adopt takes only what the user "
                                   "running it can read", subject=str(f.disk)) from None
        except OSError as e:   # replaced since it was listed (by a symlink: ELOOP), or gone
            raise Unavailable(f"{f.path}: cannot open {f.disk}: {e.strerror}", subject=str(f.disk)) from None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (f.dev, f.ino):   # a directory on the way swapped for a symlink, or the file
                raise Unavailable(f"{f.path}: {f.disk} is not the file listed (it was replaced since): not read",
                                  subject=str(f.disk))
            digest = _verified_digest(f, fd, st.st_size)
            with self._lock:
                self.local[digest] = LocalSource(digest, str(f.disk), "", st.st_size, st.st_mtime_ns)
                present = digest in self.staging.staged or self.store.blobs.has(digest)
                if present:
                    self.result.files_present += 1
                    self.result.bytes_present += st.st_size
            if not present:
                linked = self._link(f, st, digest) if st.st_dev == self._tmp_dev else None
                if linked is not None:
                    self._keep(*linked)
                else:
                    self._keep(self._copy(f, fd, digest))
            return ListedFile(digest, st.st_size)
        finally:
            os.close(fd)

    def _link(self, f: AdoptableFile, st: os.stat_result, digest: str) -> tuple[LinkedBlob, AdoptedBlob] | None:
        """The file hard-linked into tmp/ and made read-only, and its row;
        None where the filesystem or the file's owner refuses either (it is
        copied then)."""
        tmp = Path(f"{tmp_name(self.store.layout.tmp_dir, 'ingest')}{ADOPT_SUFFIX}")
        try:
            os.link(f.disk, tmp, follow_symlinks=False)
        except OSError as e:
            if e.errno in LINK_REFUSED:
                return None
            raise Unavailable(f"cannot link {f.disk} into {tmp.parent}: {e.strerror}", subject=str(f.disk)) from e
        linked_st = os.lstat(tmp)
        if (linked_st.st_dev, linked_st.st_ino) != (st.st_dev, st.st_ino):   # the path names another file now
            os.unlink(tmp)   # never made read-only, nor kept: it is not what was hashed
            raise IntegrityError(f"{f.path}: {f.disk} was replaced while it was being adopted", subject=str(f.disk))
        try:
            os.chmod(tmp, BLOB_MODE)
        except PermissionError:   # not the file's owner: its owner could change it at will
            os.unlink(tmp)
            return None
        linked = LinkedBlob(digest, st.st_size, tmp, mode=st.st_mode & 0o7777,
                            blob_path=self.store.blobs.path(digest))
        after = os.lstat(tmp)
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            linked.discard()
            raise IntegrityError(f"{f.path}: {f.disk} changed while it was being adopted", subject=str(f.disk))
        return linked, AdoptedBlob.of(digest, str(f.disk), after)

    def _copy(self, f: AdoptableFile, fd: int, digest: str) -> StagedBlob:
        with self.store.blobs.writer(label="adopt") as w, os.fdopen(os.dup(fd), "rb") as src:
            size = os.fstat(fd).st_size
            w.copy_range(src, 0, size)
            try:
                staged = w.stage(expected_digest=digest, expected_size=size)
            except IntegrityError:
                raise IntegrityError(f"{f.path}: {f.disk} changed while it was being adopted",
                                     subject=str(f.disk)) from None
        reflinked = shared_bytes(staged.tmp_path)
        with self._lock:
            self.result.files_copied += 1
            self.result.bytes_copied += size - reflinked
            self.result.bytes_reflinked += reflinked
        return staged

    def _keep(self, staged: StagedBlob, row: AdoptedBlob | None = None) -> None:
        with self._lock:
            if staged.digest in self.staging.staged:   # the same bytes under two names, staged by both at once
                staged.discard()
                self.result.files_present += 1
                self.result.bytes_present += staged.size
                return
            self.staging.add_staged(staged)
            if row is not None:
                self.adopted[row.digest] = row
                self.result.files_linked += 1
                self.result.bytes_linked += row.size

    def staging_of(self, checked: CheckedCarton) -> Staging:
        """The staged blobs of one carton, taken out of the adopt's staging."""
        own = Staging(self.store.blobs)
        for digest in [checked.digest, *(e.digest for e in checked.entries)]:
            staged = self.staging.staged.pop(digest, None)
            if staged is not None:
                own.add_staged(staged)
        return own


def _verified_digest(f: AdoptableFile, fd: int, size: int) -> str:
    """sha256 of the file's bytes, checked against what its name claims."""
    h = sha256()
    is_git = f.claim is not None and f.claim.algorithm == "git-sha1"
    git = git_blob(size) if is_git else None
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    at = 0
    while n := os.preadv(fd, [view], at):
        h.update(view[:n])
        if git is not None:
            git.update(view[:n])
        at += n
    if at != size:
        raise IntegrityError(f"{f.path}: {f.disk} changed while it was read ({size} bytes, then {at})",
                             subject=str(f.disk))
    digest = h.hexdigest()
    claimed = git.hexdigest() if git is not None else digest
    if f.claim is not None and claimed != f.claim.hexdigest:
        raise IntegrityError(f"{f.path}: the bytes of {f.disk} do not match its name: named for {f.claim.algorithm} "
                             f"{f.claim.hexdigest}, they hash to {claimed}", subject=str(f.disk))
    return digest


def adopt(store: StoreParts, path: Path, *, name: str | None, commit: Commit) -> AdoptResult:
    """Adopt what ``path`` holds (see the module's doc); ``commit`` is
    Store.commit_checked. One carton per model; ``name`` only where there
    is one model."""
    if name is not None:
        validate_name(name)
    models = read_adoptable(path)
    if name is not None and len(models) > 1:
        raise InvalidInput(f"{path} holds {len(models)} models ({', '.join(m.model_name for m in models[:4])}...): "
                           "--name names one; adopt it without --name", subject=str(path))
    result = AdoptResult()
    staged = _Staged(store, result)
    try:
        listed = staged.take_all([f for m in models for f in m.files])
        cartons = [_checked(model, listed, staged) for model in models]
        for _model, checked in cartons:
            check_staged_safetensors(checked, staged.staging)
        for model, checked in cartons:
            try:
                _commit_one(model, checked, staged, name=name, commit=commit)
            except CartonStoreError as e:
                if result.models:
                    kept = ", ".join(f"{m.model_name} ({m.digest})" for m in result.models)
                    e.message += f"; the models adopted before it are kept: {kept}"
                    e.details["adopted"] = [m.as_json() for m in result.models]
                raise
    finally:
        staged.staging.discard()
    return result


def _commit_one(model: AdoptableModel, checked: CheckedCarton, staged: _Staged, *, name: str | None,
                commit: Commit) -> None:
    generated = frozenset({checked.digest} | {e.digest for e in checked.entries if e.path == "carton.toml"})
    digests = list(dict.fromkeys(e.digest for e in checked.entries))
    r = commit(checked, staged.staging_of(checked), name=name, source=f"adopted:{model.origin}",
               provenance=Provenance("adopted", generated),
               local_sources=[staged.local[d] for d in digests if d in staged.local],
               adopted=[staged.adopted[d] for d in digests if d in staged.adopted],
               default=default_name(model.model_name))
    staged.result.models.append(AdoptedModel(r.digest, model.model_name, model.origin, len(checked.entries) - 1,
                                             sum(e.size or 0 for e in checked.entries), r.naming))


def _checked(model: AdoptableModel, listed: dict[Path, ListedFile],
             staged: _Staged) -> tuple[AdoptableModel, CheckedCarton]:
    carton_name = model.carton_name or model.model_name
    carton = files_carton(carton_name, {f.path: listed[f.disk] for f in model.files}, origin=model.origin,
                          description=model.description)
    carton = runnable_files_carton(carton, carton_name, staged.staging.path_of, origin=model.origin,
                                   description=model.description)
    checked = check_carton(carton.view(model.origin), links_raw=b"")
    staged.staging.add_small(carton.small)
    return model, checked

