"""Adding a Hugging Face repository at a revision to the store.

The revision is resolved to its commit once; the carton is the commit's
files (those the globs select) under ``model/``, its carton.toml generated
(carton/from_files.py), its source ``hf://ORG/NAME@COMMIT``: two tags of one
commit are one carton, and a commit added before is named again without a
byte fetched. An LFS file's sha256 is its blob key, so a file the store has
from any source is not fetched; a file kept in git is fetched and hashed as
it comes (and checked against its git object id). Every file comes from
``/{repo}/resolve/{commit}/{path}`` through the fetch path (redirects to
the CDN, Range resume, parallel parts, retries), is verified by its sha256
and size before anything is visible, and that URL is recorded as its
source, so a blob a collection evicts comes back from the Hub. Without
--lazy every blob is staged first and the carton committed with them, so
a file whose bytes are not its LFS sha256 leaves the store as it was.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from cartonstore.carton.checks import check_carton
from cartonstore.carton.from_files import ListedFile, files_carton
from cartonstore.errors import CartonStoreError, FetchError, IntegrityError, InvalidInput
from cartonstore.fetch.sources.peers import Claim, offer
from cartonstore.fetch.transfer.download import SourcesFailed, download, fetch_blob, stage_to_the_end
from cartonstore.store.content.blobs import StagedBlob
from cartonstore.store.content.hashing import git_blob, hash_span
from cartonstore.store.ingest import IngestResult, Staging
from cartonstore.system.single_flight import all_or_none

from .hub import Hub
from .listing import HubFile
from .reference import HubReference

if TYPE_CHECKING:
    from cartonstore.fetch.puller import Puller


async def add_from_hub(puller: Puller, ref: HubReference, name: str | None, force: bool, *,
                       lazy: bool = False) -> IngestResult:
    hub = Hub(puller.client)
    revision = await hub.revision(ref)
    at_commit = ref.at(revision.commit)
    store = puller.store
    row = await asyncio.to_thread(store.index.carton_for_source, str(at_commit))
    if row is not None:   # this commit's files, added before: the same carton (the puller completes it)
        naming = await asyncio.to_thread(store.name_carton, row.digest, name, force=force)
        return IngestResult(row.digest, naming.name, True, 0, 0, 0, naming)
    wanted = [f for f in revision.files if ref.wants(f.path)]
    if not wanted:
        raise InvalidInput(f"{ref}: no file of commit {revision.commit} matches the --include/--exclude globs "
                           f"(it has {len(revision.files)})", subject=str(ref))
    return await _Add(puller, hub, at_commit, Staging(store.blobs)).run(wanted, name, force, lazy)


class _Add:
    """One add's files, staged from peers or the Hub."""

    def __init__(self, puller: Puller, hub: Hub, ref: HubReference, staging: Staging) -> None:
        self.puller = puller
        self.hub = hub
        self.ref = ref
        self.staging = staging
        self.slots = asyncio.Semaphore(puller.config.max_concurrency)

    def url(self, f: HubFile) -> str:
        return self.hub.resolve_url(self.ref.repo, self.ref.revision, f.path)

    async def run(self, files: list[HubFile], name: str | None, force: bool, lazy: bool) -> IngestResult:
        puller, staging = self.puller, self.staging
        try:
            git_files = [f for f in files if f.sha256 is None]
            hashed = dict(zip([f.path for f in git_files],
                              await all_or_none(self.stage_git_file(f) for f in git_files), strict=True))
            listed = {f.path: ListedFile(f.sha256 or hashed[f.path], f.size) for f in files}
            carton = files_carton(self.ref.repo, listed, origin=str(self.ref))
            await asyncio.to_thread(check_carton, carton.view(str(self.ref)))   # before any file is fetched
            links: dict[str, tuple[str, ...]] = {}
            for f in files:
                links.setdefault(listed[f.path].digest, (self.url(f),))
            lfs = {} if lazy else {f.sha256: f for f in files if f.sha256 is not None}
            missing = await asyncio.to_thread(
                lambda: [d for d in lfs if d not in staging.staged and not puller.store.blobs.has(d)])
            async with puller.fetcher.peers.claiming({d: lfs[d].size for d in missing}) as claims:  # until committed
                await all_or_none(self.stage_lfs_file(lfs[d], claims) for d in missing)
                return await asyncio.to_thread(
                    puller.store.commit_files_carton, carton, staging, model_name=self.ref.repo, origin=str(self.ref),
                    links=links, kind="hf", name=name, source=str(self.ref), force=force, read_files=not lazy)
        except BaseException:
            staging.discard()
            raise

    async def stage_git_file(self, f: HubFile) -> str:
        """A file kept in git, fetched and hashed as it comes; its sha256."""
        puller, url = self.puller, self.url(f)
        async with self.slots:
            try:
                with puller.store.blobs.writer(label="hf") as writer:
                    await download(puller.client, url, writer, puller.config, stats=puller.stats,
                                   expected_size=f.size)
                    staged = await stage_to_the_end(writer, expected_size=f.size)
            except FetchError as e:
                raise self.hub.refusal(url, self.ref, e, file=f.path) from None
        try:
            if f.git_oid is not None:
                await asyncio.to_thread(_check_git_oid, staged, f, url)
        except BaseException:
            staged.discard()
            raise
        puller.stats.blobs("hf")
        if staged.digest in self.staging.staged:   # two git files with the same bytes
            staged.discard()
        else:
            self.staging.add_staged(staged)
        return staged.digest

    async def stage_lfs_file(self, f: HubFile, claims: dict[str, Claim]) -> None:
        """An LFS file, from a peer that has it, else the Hub; verified by its sha256 and size."""
        digest, puller = f.sha256, self.puller
        assert digest is not None
        async with self.slots:
            staged = await puller.fetcher.stage_from_peer(digest, claims.get(digest), expected_size=f.size)
            if staged is None:
                try:
                    staged = await fetch_blob(puller.client, puller.store.blobs, digest, [self.url(f)],
                                              puller.config, stats=puller.stats, kind_of=lambda _u: "hf",
                                              expected_size=f.size)
                except SourcesFailed as e:
                    raise self._named(f, e) from None
        self.staging.add_staged(staged)
        offer(claims, digest, staged.tmp_path)

    def _named(self, f: HubFile, error: SourcesFailed) -> CartonStoreError:
        if any(isinstance(e, IntegrityError) for e in error.errors):
            return IntegrityError(f"{self.ref}: {f.path}: the Hub's bytes are not those its LFS sha256 {f.sha256} "
                                  f"and size {f.size} name ({'; '.join(error.problems)}); nothing was stored",
                                  subject=f.path)
        return self.hub.refusal(self.url(f), self.ref, error, file=f.path)


def _check_git_oid(staged: StagedBlob, f: HubFile, url: str) -> None:
    """A git file's bytes against the object id the listing gives it, read
    in steps (the listing's size is the Hub's word, not a bound)."""
    h = git_blob(staged.size)
    with open(staged.tmp_path, "rb", buffering=0) as file:
        hash_span(file.fileno(), 0, staged.size, h, name=f.path)
    got = h.hexdigest()
    if got != f.git_oid:
        raise IntegrityError(f"{url}: {f.path}: its bytes are git object {got}, the Hub lists {f.git_oid}; "
                             f"nothing was stored", subject=f.path)
