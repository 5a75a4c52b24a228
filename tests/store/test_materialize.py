"""Materializing: link strategies, whole-or-nothing trees, concurrent callers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, work_in_tmp

from cartonstore.errors import NotFound
from cartonstore.format.entry import EntryRow
from cartonstore.store import Store
from cartonstore.store.materialize.tree import build_tree, link_or_copy, plan_tree


def test_plan_lists_parents_first_and_manifest() -> None:
    plan = plan_tree([EntryRow("model/a/b/c.bin", "1" * 64, 1, "file", None),
                      EntryRow("model/l", "1" * 64, None, "symlink", "a/b/c.bin"),
                      EntryRow("carton.toml", "2" * 64, 1, "file", None)], "f" * 64)
    assert plan.dirs == ("model", "model/a", "model/a/b")
    assert ("MANIFEST", "f" * 64) in plan.files
    assert plan.symlinks == (("model/l", "a/b/c.bin"),)


def test_link_or_copy_hardlinks_on_one_filesystem(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"data")
    assert link_or_copy(src, tmp_path / "dst") == "hardlink"
    assert (tmp_path / "dst").stat().st_ino == src.stat().st_ino


def test_link_or_copy_copies_across_filesystems(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a filesystem other than the test tmp dir")
    src = tmp_path / "src"
    src.write_bytes(b"cross-device bytes")
    dst = shm / f"cartonstore-test-{os.getpid()}"
    try:
        assert link_or_copy(src, dst) == "copy"
        assert dst.read_bytes() == b"cross-device bytes"
        assert dst.stat().st_mode & 0o222 == 0
    finally:
        dst.unlink(missing_ok=True)


def test_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / ("a" * 64)).write_bytes(b"present")
    plan = plan_tree([EntryRow("model/ok.bin", "a" * 64, 7, "file", None),
                      EntryRow("model/gone.bin", "b" * 64, 7, "file", None)], "a" * 64)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    dest = tmp_path / "models" / "x"
    dest.parent.mkdir()
    with pytest.raises(NotFound, match="b{64}"):
        build_tree(plan, lambda d: blobs / d, tmp, dest)
    assert not dest.exists()
    assert [p.name for p in tmp.iterdir() if not p.name.startswith("owner-")] == []


def test_materialize_refuses_an_incomplete_carton(store: Store, make_carton) -> None:
    from conftest import sha

    from cartonstore.format.links import build_links

    missing = b"not in the zip"
    files = {"model/w.bin": missing}
    p = make_carton(files, omit=("model/w.bin",),
                    links=build_links({sha(missing): ["https://example.invalid/w"]}))
    d = store.add(p).digest
    with pytest.raises(NotFound, match="missing 1 blob"):
        store.materialize(d)
    assert not (store.root / "models" / d).exists()


def _cli(root: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cartonstore.cli", *args, "--root", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_concurrent_processes_add_and_materialize_one_carton(tmp_path: Path) -> None:
    root = tmp_path / "root"
    adds = [_cli(root, "add", str(FIXTURE_CARTON)) for _ in range(4)]
    results = [(p.wait(60), p.stdout.read(), p.stderr.read()) for p in adds]
    assert all(code == 0 for code, _, _ in results), results
    assert {out.splitlines()[-1] for _, out, _ in results} == {FIXTURE_DIGEST}
    paths = [_cli(root, "path", FIXTURE_DIGEST) for _ in range(4)]
    outs = [(p.wait(60), p.stdout.read().strip()) for p in paths]
    assert {o for _, o in outs} == {str(root / "models" / FIXTURE_DIGEST)}
    with Store(root) as s:
        report = s.verify()
        assert report.ok and report.blobs_checked == 12 and not report.unindexed_blobs
    assert work_in_tmp(root) == []


def test_a_use_within_touch_after_takes_no_write_lock(tmp_path: Path) -> None:
    """`path` of a carton used moments ago only reads: it does not wait for
    another process's write transaction (busy_timeout is 30 s)."""
    import sqlite3
    import time

    with Store(tmp_path / "root") as store:
        digest = store.add(FIXTURE_CARTON).digest
        store.materialize(digest)
        other = sqlite3.connect(store.layout.index_db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            t0 = time.monotonic()
            assert store.materialize(digest).is_dir()
            assert time.monotonic() - t0 < 5
        finally:
            other.execute("ROLLBACK")
            other.close()


def test_link_tree_lays_a_model_out_again_by_hardlinks_read_only(tmp_path: Path) -> None:
    """What a runner started before its model reads (server/runner_processes/waiting.py):
    the same files (the same inodes), directories nested, symlinks as they
    were (a symlinked directory not followed), every directory read-only."""
    from cartonstore.store.materialize.tree import link_tree

    src = tmp_path / "model"
    (src / "model" / "shards").mkdir(parents=True)
    (src / "carton.toml").write_text("spec_version = 1\n")
    (src / "model" / "shards" / "a.bin").write_bytes(b"a" * 100)
    os.symlink("shards/a.bin", src / "model" / "first.bin")
    os.symlink("shards", src / "model" / "linked")
    dst = tmp_path / "slot"
    dst.mkdir()
    link_tree(src, dst)
    assert os.stat(dst / "model" / "shards" / "a.bin").st_ino == os.stat(src / "model" / "shards" / "a.bin").st_ino
    assert (dst / "carton.toml").read_text() == "spec_version = 1\n"
    assert os.readlink(dst / "model" / "first.bin") == "shards/a.bin"
    assert os.readlink(dst / "model" / "linked") == "shards"
    assert (dst / "model" / "first.bin").read_bytes() == b"a" * 100
    for directory in (dst / "model", dst / "model" / "shards"):
        assert oct(directory.stat().st_mode & 0o777) == "0o555", directory
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*")) == sorted(
        p.relative_to(src).as_posix() for p in src.rglob("*"))
