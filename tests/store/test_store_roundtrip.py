"""The fixture and hand-made cartons through add, path, export and add again."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, MINIMAL_TOML, manifest_for, sha

from cartonstore.errors import Conflict, NotFound
from cartonstore.store import Store


def test_fixture_round_trip(store: Store, tmp_path: Path) -> None:
    r = store.add(FIXTURE_CARTON)
    assert r.digest == FIXTURE_DIGEST
    assert r.complete
    model = store.materialize(r.digest)
    assert model == store.root / "models" / FIXTURE_DIGEST
    assert (model / "MANIFEST").read_bytes().startswith(b"carton.toml=873c406a")
    assert sha((model / "MANIFEST").read_bytes()) == FIXTURE_DIGEST
    assert (model / "model" / "main.py").is_file()
    assert (model / "tensor_data" / "index.toml").is_file()
    out = tmp_path / "again.carton"
    store.export(r.digest, out)
    other = Store(tmp_path / "other")
    try:
        assert other.add(out).digest == FIXTURE_DIGEST
        assert sorted(os.listdir(other.materialize(FIXTURE_DIGEST) / "misc")) == sorted(os.listdir(model / "misc"))
    finally:
        other.close()


def test_materialized_tree_is_read_only_hardlinks(store: Store) -> None:
    digest = store.add(FIXTURE_CARTON).digest
    model = store.materialize(digest)
    for dirpath, _dirnames, filenames in os.walk(model):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) & 0o222 == 0
        for n in filenames:
            p = Path(dirpath) / n
            st = p.stat()
            assert stat.S_IMODE(st.st_mode) & 0o222 == 0
            blob = store.blobs.path(sha(p.read_bytes()))
            assert os.stat(blob).st_ino == st.st_ino, "model files are hardlinks to the blobs"


def test_blobs_are_read_only_and_named_by_their_hash(store: Store) -> None:
    store.add(FIXTURE_CARTON)
    digests = list(store.blobs.iter_digests())
    assert len(digests) == 12  # 11 files + MANIFEST
    for d in digests:
        p = store.blobs.path(d)
        assert sha(p.read_bytes()) == d
        assert stat.S_IMODE(p.stat().st_mode) == 0o444


def test_second_materialize_reuses_the_directory(store: Store) -> None:
    digest = store.add(FIXTURE_CARTON).digest
    first = store.materialize(digest)
    ino = first.stat().st_ino
    assert store.materialize(digest[:8]) == first
    assert first.stat().st_ino == ino


def test_add_twice_stores_nothing_new(store: Store) -> None:
    store.add(FIXTURE_CARTON)
    again = store.add(FIXTURE_CARTON)
    assert again.blobs_added == 0 and again.bytes_added == 0
    assert again.bytes_reused > 0


def test_blob_shared_by_two_cartons_is_stored_once(store: Store, make_carton) -> None:
    big = os.urandom(4096)
    a = store.add(make_carton({"model/w.bin": big, "model/a.txt": b"a"}))
    b = store.add(make_carton({"model/w.bin": big, "model/b.txt": b"b"}))
    assert a.digest != b.digest
    assert b.bytes_reused >= 4096
    links = [p for p in store.root.joinpath("blobs").rglob("*") if p.is_file() and p.name == sha(big)]
    assert len(links) == 1


def test_ref_resolution(store: Store, make_carton) -> None:
    d = store.add(make_carton(), name="alpha").digest
    assert store.resolve(d) == d
    assert store.resolve(d[:8]) == d
    assert store.resolve("alpha") == d
    with pytest.raises(NotFound, match="no carton matches 'nope'"):
        store.resolve("nope")
    with pytest.raises(NotFound, match="abcdef01"):
        store.resolve("abcdef01")


def test_default_name_is_model_name(store: Store, make_carton) -> None:
    d = store.add(make_carton()).digest
    assert store.resolve("tiny") == d


def test_ambiguous_prefix_is_a_conflict(store: Store, make_carton) -> None:
    digests = [store.add(make_carton({"model/x": str(i).encode()})).digest for i in range(40)]
    by_first = {}
    for d in digests:
        by_first.setdefault(d[0], []).append(d)
    pair = next(v for v in by_first.values() if len(v) > 1)
    common = os.path.commonprefix(pair)  # noqa: RUF071 - digests are strings: a prefix of characters is meant
    # A prefix shorter than 8 is never a prefix; pad the test to what makes sense.
    if len(common) >= 8:
        with pytest.raises(Conflict, match="ambiguous"):
            store.resolve(common)
    with pytest.raises(NotFound):
        store.resolve(pair[0][:7])


def test_directory_source_without_manifest(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "unpacked"
    (src / "model").mkdir(parents=True)
    (src / "carton.toml").write_bytes(MINIMAL_TOML)
    (src / "model" / "w.bin").write_bytes(b"weights")
    r = store.add(src)
    files = {"carton.toml": MINIMAL_TOML, "model/w.bin": b"weights"}
    assert r.digest == sha(manifest_for(files))
    assert (store.materialize(r.digest) / "model" / "w.bin").read_bytes() == b"weights"


def test_materialized_directory_adds_back_to_the_same_hash(store: Store, tmp_path: Path) -> None:
    d = store.add(FIXTURE_CARTON).digest
    other = Store(tmp_path / "other")
    try:
        assert other.add(store.materialize(d)).digest == d
    finally:
        other.close()


def test_symlink_inside_model_is_kept(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "withlink"
    (src / "model" / "sub").mkdir(parents=True)
    (src / "carton.toml").write_bytes(MINIMAL_TOML)
    (src / "model" / "sub" / "real.bin").write_bytes(b"real bytes")
    os.symlink("sub/real.bin", src / "model" / "alias.bin")
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"outside")
    os.symlink(outside, src / "model" / "copied.txt")
    d = store.add(src).digest
    model = store.materialize(d)
    assert os.readlink(model / "model" / "alias.bin") == "sub/real.bin"
    assert (model / "model" / "alias.bin").read_bytes() == b"real bytes"
    assert not (model / "model" / "copied.txt").is_symlink()
    assert (model / "model" / "copied.txt").read_bytes() == b"outside"
    out = tmp_path / "withlink.carton"
    store.export(d, out)
    other = Store(tmp_path / "other")
    try:
        assert other.add(out).digest == d
        assert os.readlink(other.materialize(d) / "model" / "alias.bin") == "sub/real.bin"
    finally:
        other.close()


def test_remove_frees_only_unshared_blobs(store: Store, make_carton) -> None:
    shared = b"shared" * 100
    a = store.add(make_carton({"model/s.bin": shared, "model/a.bin": b"only a"})).digest
    b = store.add(make_carton({"model/s.bin": shared, "model/b.bin": b"only b"})).digest
    store.materialize(a)
    r = store.remove(a)
    assert r.blobs_removed == 2  # model/a.bin and a's MANIFEST
    assert not (store.root / "models" / a).exists()
    assert store.blobs.has(sha(shared))
    assert not store.blobs.has(sha(b"only a"))
    assert (store.materialize(b) / "model" / "s.bin").read_bytes() == shared
    with pytest.raises(NotFound):
        store.resolve(a)


def test_verify_passes_on_a_sound_store(store: Store) -> None:
    store.materialize(store.add(FIXTURE_CARTON).digest)
    report = store.verify()
    assert report.ok and report.blobs_checked == 12 and report.models_checked == 1


def test_verify_finds_and_repairs_a_corrupt_blob(store: Store) -> None:
    d = store.add(FIXTURE_CARTON).digest
    store.materialize(d)
    victim = next(e for e in store.index.entries(d) if e.path == "model/main.py")
    p = store.blobs.path(victim.digest)
    os.chmod(p, 0o644)
    p.write_bytes(b"tampered")
    report = store.verify()
    assert not report.ok
    assert report.corrupt_blobs == [victim.digest]
    assert d in report.damaged_models
    fixed = store.verify(repair=True)
    assert any("quarantined" in x for x in fixed.repaired)
    assert list((store.root / "quarantine").iterdir())
    after = store.verify()
    assert after.ok, after
    assert store.index.missing_blobs(d) == [victim.digest]
    store.add(FIXTURE_CARTON)  # a source that holds the blob completes the carton again
    assert (store.materialize(d) / "model" / "main.py").read_bytes() != b"tampered"
    assert store.verify().ok


def test_verify_repairs_a_damaged_model_directory(store: Store) -> None:
    d = store.add(FIXTURE_CARTON).digest
    model = store.materialize(d)
    os.chmod(model / "model", 0o755)
    (model / "model" / "main.py").unlink()
    (model / "model" / "extra.txt").write_text("x")
    report = store.verify()
    assert set(report.damaged_models[d]) >= {"model/main.py: missing", "model/extra.txt: not in MANIFEST"}
    store.verify(repair=True)
    assert store.verify().ok
    assert (store.materialize(d) / "model" / "main.py").is_file()
