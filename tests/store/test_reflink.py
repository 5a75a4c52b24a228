"""Ingest shares the disk blocks of stored entries where the filesystem can
(issue 14): on XFS (btrfs alike) a block-aligned stored entry is reflinked
into the store, not copied, and still hashed from the blob file it became.

A real XFS filesystem: an image made by mkfs.xfs (Debian: xfsprogs) and
loop-mounted by the test, which needs root; the tests skip, naming what is
missing, where either is not there. The fallback (ext4, tmpfs, unaligned
entries) is what every other ingest test runs on.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import MINIMAL_TOML, carton_entries, manifest_for, sha, snapshot, write_zip
from kit.daemonkit import wait_for

from cartonstore.errors import ManifestMismatch
from cartonstore.store import Store
from cartonstore.store.content.filespace import clone_range
from cartonstore.zipfmt import STORED, ZipWriter

ENTRY = 32 << 20


@pytest.fixture(scope="module")
def xfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A freshly made XFS filesystem (reflink on), mounted for this module."""
    if os.geteuid() != 0:
        pytest.skip("loop-mounting an XFS image needs root")
    mkfs = shutil.which("mkfs.xfs")
    if mkfs is None:
        pytest.skip("mkfs.xfs is not installed (Debian package xfsprogs)")
    base = tmp_path_factory.mktemp("xfs")
    image, mnt = base / "fs.img", base / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(512 << 20)
    subprocess.run([mkfs, "-q", "-f", "-m", "reflink=1", str(image)], check=True, capture_output=True)
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount an XFS image here: {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def used_bytes(path: Path) -> int:
    os.sync()
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def filesystem_size(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def freed_within(path: Path, before: int, wanted: int, *, seconds: float) -> bool:
    """Whether free space grows by ``wanted`` bytes within ``seconds``: XFS
    inactivates unlinked inodes in the background, so their blocks come back
    a little after the unlink, and statfs does not wait for them."""
    from cartonstore.store.gc.plan import disk_free

    polls = itertools.count()

    def freed() -> bool:
        if next(polls) % 10 == 0:   # a sync now and then (it writes the whole system's dirty pages), statfs between
            os.sync()
        return disk_free(path) - before >= wanted
    return wait_for(freed, seconds)


def pack(path: Path, files: dict[str, bytes], manifest: bytes | None = None) -> Path:
    with ZipWriter(path) as writer:  # stored entries of 64 KiB or more start block-aligned
        for name, data in carton_entries(files, manifest=manifest):
            writer.add_bytes(name, data, method=STORED)
    return path


def test_an_aligned_stored_entry_is_shared_not_copied(xfs: Path) -> None:
    weights = os.urandom(ENTRY)
    carton = pack(xfs / "shared.carton", {"carton.toml": MINIMAL_TOML, "model/w.bin": weights})
    before = used_bytes(xfs)
    with Store(xfs / "root-shared") as store:
        result = store.add(carton)
        blob = store.blobs.path(sha(weights))
        assert result.complete and blob.read_bytes() == weights
        assert store.verify().ok
    grew = used_bytes(xfs) - before
    assert grew < ENTRY // 4, f"the store grew by {grew} bytes for a {ENTRY}-byte entry it should share"


def test_an_entry_of_whole_blocks_and_a_tail_is_shared_then_copied(xfs: Path) -> None:
    """The block-aligned part is shared, the last partial block copied after
    it (written where the shared part ends): the blob is the entry's bytes."""
    weights = os.urandom(ENTRY + 1000)
    carton = pack(xfs / "tail.carton", {"carton.toml": MINIMAL_TOML, "model/w.bin": weights})
    before = used_bytes(xfs)
    with Store(xfs / "root-tail") as store:
        assert store.add(carton).complete
        assert store.blobs.path(sha(weights)).read_bytes() == weights
        assert store.verify().ok
    assert used_bytes(xfs) - before < ENTRY // 4


def test_an_unaligned_entry_is_copied(xfs: Path) -> None:
    """Python's zipfile aligns nothing: the bytes are copied, as on ext4."""
    weights = os.urandom(ENTRY)
    files = {"carton.toml": MINIMAL_TOML, "model/w.bin": weights}
    carton = write_zip(xfs / "unaligned.carton", carton_entries(files))
    before = used_bytes(xfs)
    with Store(xfs / "root-copied") as store:
        assert store.add(carton).complete
        assert store.blobs.path(sha(weights)).read_bytes() == weights
    assert used_bytes(xfs) - before >= ENTRY


def test_shared_bytes_that_do_not_match_manifest_are_refused(xfs: Path) -> None:
    """The reflinked bytes are hashed like copied ones: a wrong entry is named,
    and the store is as it was (nothing staged is left in tmp/)."""
    claimed, actual = os.urandom(ENTRY), os.urandom(ENTRY)
    good = {"carton.toml": MINIMAL_TOML, "model/w.bin": claimed}
    carton = pack(xfs / "lying.carton", {**good, "model/w.bin": actual}, manifest=manifest_for(good))
    root = xfs / "root-lying"
    Store(root).close()
    before = snapshot(root)
    with Store(root) as store, pytest.raises(ManifestMismatch, match="model/w.bin"):
        store.add(carton)
    assert snapshot(root) == before
    assert not any(p.name.startswith("ingest-") for p in (root / "tmp").iterdir())


def test_clone_range_says_no_where_blocks_cannot_be_shared(tmp_path: Path) -> None:
    """tmpfs shares no blocks: clone_range answers False, and the caller copies."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm (tmpfs) here")
    src, dst = shm / f"cs-clone-{os.getpid()}-a", shm / f"cs-clone-{os.getpid()}-b"
    try:
        src.write_bytes(os.urandom(1 << 16))
        with open(src, "rb") as s, open(dst, "wb") as d:
            assert clone_range(s.fileno(), 0, 1 << 16, d.fileno(), 0) is False
        assert dst.stat().st_size == 0
    finally:
        src.unlink(missing_ok=True)
        dst.unlink(missing_ok=True)


@pytest.mark.parametrize(("refusal", "fails"), [(errno.EAGAIN, False), (errno.EIO, False), (errno.ENOSPC, True)])
def test_a_refused_clone_is_copied_and_only_no_space_fails(xfs: Path, monkeypatch, refusal: int,
                                                           fails: bool) -> None:
    """The kernel's answer to FICLONERANGE is injected (no local filesystem
    gives EAGAIN as OpenZFS 2.2 does): any refusal but ENOSPC is copied
    instead; ENOSPC fails the add, naming it, with tmp/ left empty."""
    import fcntl as real_fcntl

    from cartonstore.errors import Unavailable
    from cartonstore.store.content import filespace

    def ioctl(fd, request, *args) -> Any:
        if request == filespace.FICLONERANGE:
            raise OSError(refusal, os.strerror(refusal))
        return real_fcntl.ioctl(fd, request, *args)

    monkeypatch.setattr(filespace.fcntl, "ioctl", ioctl)
    weights = os.urandom(1 << 20)
    carton = pack(xfs / f"refused-{refusal}.carton", {"carton.toml": MINIMAL_TOML, "model/w.bin": weights})
    root = xfs / f"root-refused-{refusal}"
    with Store(root) as store:
        if fails:
            with pytest.raises(Unavailable, match="no space left on device while writing"):
                store.add(carton)
            assert not store.blobs.has(sha(weights))
            assert not any(p.name.startswith("ingest-") for p in (root / "tmp").iterdir())
        else:
            assert store.add(carton).complete and store.blobs.path(sha(weights)).read_bytes() == weights



def test_min_free_does_not_evict_blobs_whose_blocks_their_zips_still_hold(xfs: Path) -> None:
    """Blobs that share their zips' blocks free no disk when evicted: a gc
    short of free space leaves their cartons alone (before, each run
    evicted another one, freeing nothing); once a zip is gone, its blob's
    blocks are its own, and removing it frees them."""
    from cartonstore.store.gc.plan import GcPolicy, disk_free

    weights = [os.urandom(ENTRY) for _ in range(3)]
    cartons = [pack(xfs / f"gc{i}.carton", {"carton.toml": MINIMAL_TOML.replace(b'"tiny"', f'"g{i}"'.encode()),
                                             "model/w.bin": w}) for i, w in enumerate(weights)]
    with Store(xfs / "root-gc") as store:
        for carton in cartons:
            store.add(carton)
        # min_free is the whole filesystem, never met: XFS frees blocks in the background
        # (speculative preallocation, deferred inode inactivation), so a threshold just above a
        # free-space reading could be met by that alone, with nothing evicted (seen in CI).
        policy = GcPolicy(min_free=filesystem_size(xfs), grace=0)
        for _ in range(2):
            report = store.collect(policy)
            assert report.evicted_blobs == 0 and report.evicted_models == [], report
            assert report.forgotten_models == [], report
        assert all(store.blobs.has(sha(w)) for w in weights)
        cartons[0].unlink()   # its blob now has no source: only forget_unrecoverable lets it go
        os.sync()
        before = disk_free(xfs)
        report = store.collect(GcPolicy(min_free=filesystem_size(xfs), grace=0, forget_unrecoverable=True))
        assert [m["names"] for m in report.forgotten_models] == [["g0"]] and not store.blobs.has(sha(weights[0]))
        assert report.evicted_blobs == 0, report
        assert freed_within(xfs, before, ENTRY * 3 // 4, seconds=10), \
            f"removing g0's blob freed {disk_free(xfs) - before} bytes, not its {ENTRY}"
        assert store.blobs.has(sha(weights[1])) and store.blobs.has(sha(weights[2]))
