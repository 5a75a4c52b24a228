"""Store: the library a user (or the CLI, or the daemon) calls.

Each public method is one operation on a store root. All of them block
(file, hash and SQLite work); async callers run them in worker threads.
Cross-process safety comes from ROOT/locks/: ``store.lock`` is taken
exclusively for the short moments that change which blobs exist (commit,
rm, gc) and shared while a model directory is built from blobs.
Collecting lives in store/gc/collect.py, verifying in verification.py.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cartonstore.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from cartonstore.format.digest import is_sha256
from cartonstore.store.content.blobs import BlobStore
from cartonstore.store.metadata.index import CartonRow, Index
from cartonstore.store.metadata.names import (
    HEX,
    MIN_PREFIX,
    NameOutcome,
    assign_name,
    check_move,
    default_name,
    removal_refused,
    validate_name,
)
from cartonstore.store.root.layout import StoreLayout
from cartonstore.store.root.locks import FileLock
from cartonstore.store.root.owner import tmp_name
from cartonstore.system.file_access import WRITE, denial
from cartonstore.zipfmt import ZipLimits

# Checking, ingesting, building, collecting and verifying are imported by
# the methods that do them: opening a store to answer `path` or `ls` stays
# cheap.
if TYPE_CHECKING:
    from cartonstore.carton.checks import CheckedCarton
    from cartonstore.carton.from_files import FilesCarton
    from cartonstore.carton.writer import WrittenCarton
    from cartonstore.format.carton_toml import CartonConfig
    from cartonstore.store.gc.plan import GcPolicy, GcReport
    from cartonstore.store.metadata.adopted_rows import AdoptedBlob
    from cartonstore.store.metadata.source_bytes import SourceBytes
    from cartonstore.store.metadata.source_rows import LocalSource
    from cartonstore.system.callers import Credentials

    from .adoption import AdoptResult
    from .ingest import IngestResult, Provenance, Staging
    from .verification import VerifyReport


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


class Store:
    """The store at a root: its layout, blob files, index and lock, and the
    operations a user calls. Collection, holds and verification take it as
    the StoreParts they need (store/gc/parts.py), so they never import it."""

    def __init__(self, root: Path | str, *, zip_limits: ZipLimits | None = None, read_only: bool = False) -> None:
        """``read_only``: open an existing store without writing to it (see
        for_reading); its writes raise PermissionDenied."""
        self.zip_limits = zip_limits or ZipLimits()
        self.read_only = read_only
        layout = StoreLayout(Path(root))
        if not read_only:
            try:
                layout.create()
            except PermissionError as e:
                raise PermissionDenied(f"this user may not change the store at {root}: "
                                       f"{denial(e.filename or root, WRITE) or e.strerror}", subject=str(root)) from e
            except OSError as e:
                raise InvalidInput(f"cannot create store at {root}: {e.strerror}", subject=str(root)) from e
        self.layout = layout
        self.blobs = BlobStore(layout)
        self.index = Index(layout.index_db, read_only=read_only)

    @classmethod
    def for_reading(cls, root: Path | str, *, zip_limits: ZipLimits | None = None) -> Store:
        """The store for a command that only reads it (ls, inspect, verify,
        the path of a built model): read-only where this process may read
        but not write it (a member of the store's group), else as Store()."""
        return cls(root, zip_limits=zip_limits, read_only=not _may_write(Path(root)))

    @property
    def root(self) -> Path:
        return self.layout.root

    def lock(self, *, shared: bool = False) -> FileLock:
        return FileLock(self.layout.locks_dir / "store.lock", shared=shared)

    def take_model_away(self, digest: str) -> Path | None:
        """Rename a model directory into tmp/ (owned by this process) so it
        disappears whole: deleting it in place could leave, after a crash, a
        half-empty directory that the next `path` would serve as it is."""
        model = self.layout.model_path(digest)
        if not model.is_dir():
            return None
        away = tmp_name(self.layout.tmp_dir, "model")
        os.rename(model, away)
        return away

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- adding --------------------------------------------------------------

    def add(self, source: str | Path, *, name: str | None = None, source_label: str | None = None,
            force: bool = False, confined: bool = False, caller: Credentials | None = None,
            provenance: Provenance | None = None) -> IngestResult:
        """Ingest a local .carton file or carton directory. Returns once the
        carton is known; raises InvalidCarton (store unchanged) when it is bad.
        An explicit name may move from another carton (result.naming says so)
        unless a daemon has that carton loaded (Conflict, unless force); the
        carton's model_name only names it when that name is free.
        URLs are the fetcher's (cartonstore.fetch.puller.Puller). ``confined``: a
        directory named by someone else (an API caller) may not make the
        store read outside it through a symlink (InvalidCarton naming it).
        ``caller``: the source is read with these credentials, not this
        process's (PermissionDenied naming the path and uid for what they
        may not read); its files are then not recorded as local sources, which
        this process would read again later with its own rights.
        ``provenance``: of a carton file fetched whole before this add reads
        it, where it came from (commit_checked); a local add counts in no
        figures."""
        text = str(source)
        if "://" in text:
            raise InvalidInput(f"cannot add {text!r} here: URLs are fetched by cartonstore.fetch.Puller "
                               "(the CLI does this for you)", subject=text)
        if name is not None:  # before any work; whether it may move is known at commit
            validate_name(name)
        from cartonstore.carton.checks import check_carton
        from cartonstore.sources import DirCartonView, open_local
        from cartonstore.store.metadata.local_sources import local_sources_of
        from cartonstore.system.callers import rights_of

        from .ingest import stage_carton, stage_unpacked

        with rights_of(caller) as rights:
            view = open_local(Path(source), self.zip_limits, confined=confined, rights=rights)
            try:
                raw = view.read_metadata("MANIFEST")
                if raw is None and isinstance(view, DirCartonView):  # hashed as staged: each file read once
                    checked, staging = stage_unpacked(view, self.blobs)
                else:
                    checked = check_carton(view, manifest_raw=raw)
                    staging = stage_carton(checked, view, self.blobs)
                try:  # where each blob can be read again once evicted (store/metadata/local_sources.py)
                    local = [] if rights.switched else local_sources_of(view, checked, skip_under=self.root)
                except BaseException:
                    staging.discard()
                    raise
            finally:
                view.close()
        return self.commit_checked(checked, staging, name=name, source=source_label or os.path.abspath(text),
                                   force=force, local_sources=local, provenance=provenance)

    def adopt(self, path: Path, *, name: str | None = None) -> AdoptResult:
        """Store what a Hugging Face cache repository, an Ollama models
        directory or a directory of model files holds, hard-linked, not
        copied (store/adoption.py). Bad input leaves the store unchanged;
        several models are committed one by one, and an error of the store
        itself at one names those committed before it."""
        from .adoption import adopt

        return adopt(self, Path(path), name=name, commit=self.commit_checked)

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
                       source: str | None, force: bool = False, local_sources: Sequence[LocalSource] = (),
                       provenance: Provenance | None = None, adopted: Sequence[AdoptedBlob] = (),
                       default: str | None = None) -> IngestResult:
        """Commit a validated carton and its staged blobs (always discards
        what is left of the staging). A source that fetched them passes its
        ``provenance`` (ingest.Provenance: its kind, what it made itself):
        the store's figures by kind of source (source_bytes()) grow in the
        commit's own transaction by the bytes fetched and those the store
        already had. ``adopted``: the linked files of an adopt, recorded
        in that transaction too (store/adoption.py); ``default``: the name
        it takes when free and none is given (else one made of its
        model_name)."""
        from cartonstore.store.materialize.tree import remove_tree

        from .ingest import commit_carton

        stale = None
        try:
            with self.lock():
                if self.index.carton(checked.digest) is None:
                    # A model directory of a carton the index does not know is a
                    # leftover (of a crash in rm or an older gc): never serve it.
                    stale = self.take_model_away(checked.digest)
                if name is not None:  # before any blob moves: a refusal leaves the store as it was
                    self.index.read(lambda conn: check_move(conn, name, checked.digest, force=force))
                return commit_carton(checked, staging, self.index, self.blobs, name=name, source=source,
                                     force=force, local_sources=local_sources, provenance=provenance,
                                     adopted=adopted, default=default)
        finally:
            staging.discard()
            if stale is not None:
                remove_tree(stale)

    def commit_files_carton(self, carton: FilesCarton, staging: Staging, *, model_name: str, origin: str,
                            links: Mapping[str, tuple[str, ...]], kind: str, name: str | None, source: str,
                            force: bool, read_files: bool, description: str | None = None) -> IngestResult:
        """Commit the carton of a source's model files (carton.from_files)
        once its files are staged or stored: declared for the runner that
        serves them where one does and ``read_files`` (every file is here to
        read: not a lazy add), checked, its LINKS the sources' URLs, its
        generated files staged, and committed with the figures of ``kind``.
        Blocking: in a worker thread."""
        from cartonstore.carton.checks import check_carton
        from cartonstore.carton.from_model import runnable_files_carton

        from .ingest import Provenance, check_staged_safetensors

        if read_files:
            carton = runnable_files_carton(carton, model_name, staging.path_of, origin=origin,
                                           description=description)
        checked = dataclasses.replace(check_carton(carton.view(origin), links_raw=b""), links=dict(links))
        staging.add_small(carton.small)
        check_staged_safetensors(checked, staging)
        made_here = frozenset({checked.digest, carton.files["carton.toml"].digest})
        return self.commit_checked(checked, staging, name=name, source=source, force=force,
                                   provenance=Provenance(kind, made_here))

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
        if len(ref) >= MIN_PREFIX and HEX.fullmatch(ref):
            found = self.index.cartons_with_prefix(ref)
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise Conflict(f"{ref!r} is ambiguous: it prefixes {', '.join(found)}", subject=ref)
        hint = (f"; a hash prefix needs at least {MIN_PREFIX} hex digits"
                if len(ref) < MIN_PREFIX and HEX.fullmatch(ref) else "")
        raise NotFound(f"no carton matches {ref!r} (not a known manifest hash, hash prefix or name{hint})",
                       subject=ref)

    def resolve_or_add(self, ref: str) -> str:
        """resolve(), and for a REF that is a source (a local path), add it first."""
        try:
            return self.resolve(ref)
        except NotFound as e:
            if os.path.exists(ref):
                return self.add(ref).digest
            raise no_such_source(ref) or e from None

    def info(self, digest: str) -> CartonInfo:
        row = self.index.carton(digest)
        if row is None:
            raise NotFound(f"no carton with manifest hash {digest} in the store", subject=digest)
        model = self.layout.model_path(digest)
        return CartonInfo(row, self.index.names_of(digest), self.index.missing_blobs(digest),
                          model if model.is_dir() else None)

    def list(self) -> list[CartonInfo]:
        """Every carton; one removed by another process while this lists is left out, not an error."""
        infos = []
        for row in self.index.cartons():
            try:
                infos.append(self.info(row.digest))
            except NotFound:
                continue
        return infos

    def source_bytes(self) -> builtins.list[SourceBytes]:
        """Per kind of source, the bytes fetched into the store and those
        not fetched because it had them (store/metadata/source_bytes.py),
        as every process adding to this store counted them."""
        return self.index.source_bytes()

    # -- materializing -------------------------------------------------------

    def materialize(self, ref: str) -> Path:
        """The carton's read-only model directory, built on first use."""
        digest = self.resolve_or_add(ref)
        self.refuse_changed_adopted(digest)
        dest = self.layout.model_path(digest)
        if not dest.is_dir():
            with FileLock(self.layout.locks_dir / f"model-{digest}.lock"):
                if not dest.is_dir():
                    self._build_model(digest, dest)
        self.index.touch(digest)
        return dest

    def refuse_changed_adopted(self, digest: str) -> None:
        """IntegrityError when a blob the carton lists was adopted from
        another tool's file and changed through its path since (quarantined
        then: store/adopted_check.py); one cheap look when nothing is adopted."""
        from .adopted_check import refuse_changed

        refuse_changed(self, digest)

    def materialized(self, digest: str) -> Path | None:
        """materialize() of a carton that needs nothing more: its model
        directory is built and no blob is missing. None when it needs work
        (fetching, or a first build, which callers hold against eviction)."""
        if not self.layout.model_path(digest).is_dir() or self.missing_blobs(digest):
            return None
        return self.materialize(digest)

    def missing_blobs(self, digest: str) -> builtins.list[str]:  # list: the method above
        """Blobs the carton lists that the store lacks. A blob file present
        without its row (a crash between rename and index commit) is adopted:
        its name proves its bytes, so the row is simply written now."""
        missing = self.index.missing_blobs(digest)
        if self.read_only or not any(self.blobs.has(d) for d in missing):
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
        from cartonstore.store.materialize.tree import build_tree, plan_tree

        plan = plan_tree(self.index.entries(digest), digest)
        with self.lock(shared=True):
            build_tree(plan, self.blobs.path, self.layout.tmp_dir, dest)

    # -- inspecting ----------------------------------------------------------

    def safetensors_of(self, digest: str) -> dict[str, builtins.list[dict]]:
        from cartonstore.carton.checks import check_safetensors, is_safetensors

        out: dict[str, list[dict]] = {}
        for e in self.index.entries(digest):
            if e.kind == "file" and is_safetensors(e.path) and self.blobs.has(e.digest):
                p = self.blobs.path(e.digest)
                opener = functools.partial(open, p, "rb")
                header = check_safetensors(e.path, opener, p.stat().st_size)  # type: ignore[arg-type]  # binary: mypy cannot pick open's overload through partial
                out[e.path] = [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}
                               for t in header.tensors]
        return out

    def config_of(self, digest: str) -> CartonConfig:
        from cartonstore.format.carton_toml import parse_carton_toml

        entry = next((e for e in self.index.entries(digest) if e.path == "carton.toml"), None)
        if entry is None or not self.blobs.has(entry.digest):
            raise NotFound(f"carton.toml of {digest} is not in the store", subject=digest)
        return parse_carton_toml(self.blobs.path(entry.digest).read_bytes())

    # -- exporting -----------------------------------------------------------

    def export(self, ref: str, out: Path, *, link_prefix: str | None = None, link_min_size: int = 0,
               compression: str = "zstd") -> WrittenCarton:
        from cartonstore.carton.checks import check_carton
        from cartonstore.carton.writer import plan_links, write_carton
        from cartonstore.store.materialize.export_view import StoreCartonView

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
        from cartonstore.store.gc.holds import drop_leases_of_gone_owners
        from cartonstore.store.materialize.tree import remove_tree

        digest = self.resolve(ref)
        with self.lock():
            drop_leases_of_gone_owners(self)
            if leases := self.index.live_leases(digest):
                raise removal_refused(digest, leases)
            orphans = self.index.remove_carton(digest)
            trash = self.take_model_away(digest)
            freed = sum(self.blobs.delete(d) for d in orphans)
        if trash is not None:
            remove_tree(trash)
        return RemoveResult(digest, len(orphans), freed)

    # -- collecting and verifying ------------------------------------------------

    def collect(self, policy: GcPolicy | None = None) -> GcReport:
        """Collect garbage (see store/gc/collect.py); with policy.dry_run, only report."""
        from cartonstore.store.gc.collect import collect as collect_garbage

        return collect_garbage(self, policy)

    def verify(self, *, repair: bool = False) -> VerifyReport:
        """Rehash every blob and check every model directory (store/verification.py)."""
        from .verification import verify as verify_store

        return verify_store(self, repair=repair, rebuild=self.materialize)


def _may_write(root: Path) -> bool:
    """Whether this process may change the store at root (a missing one: make it)."""
    try:
        os.stat(root)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    index_db = StoreLayout(root).index_db
    return denial(root, WRITE) is None and denial(index_db, WRITE) is None


def no_such_source(ref: str) -> NotFound | None:
    """For a REF that reads as a path (it holds a '/', no name does, or ends
    in .carton) and is none: "no such file", not "no carton matches"; for
    a URL, that only add fetches one."""
    if "://" in ref:
        return NotFound(f"{ref} is a URL, not a carton in the store: add it first (cartonstore add {ref}), "
                        "then name it by its name or hash", subject=ref)
    if os.sep not in ref and not ref.endswith(".carton"):
        return None
    also = "" if os.sep in ref else f", and no carton is named {ref!r}"
    return NotFound(f"no such file or directory: {ref}{also}", subject=ref)
