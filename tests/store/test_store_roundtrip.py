"""The fixture and hand-made cartons through add, path, export and add again."""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, MINIMAL_TOML, manifest_for, sha

from cartonstore.errors import Conflict, NotFound
from cartonstore.store import Store
from cartonstore.store.verification import VerifyReport


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


def _payload(label: str, fans: range) -> bytes:
    """Bytes whose blob lands in one of these fan-out directories (sha256's first byte)."""
    return next(data for i in range(10**6)
                if int(sha(data := f"{label} {i}".encode() * 50)[:2], 16) in fans)


def test_verify_reports_nothing_an_rm_or_add_changed_during_its_scan(store: Store, make_carton) -> None:
    """verify rehashes without a lock while rm, adds and collections go on:
    a blob removed with its row during the scan is neither missing nor an
    error, and one added with its row is not unindexed. A FIFO named as the
    first file of a fan-out directory holds the scan there (verify opens it
    and waits for a writer) after the rows were read and that directory
    listed, while this thread removes one carton and adds another."""
    gone_data, added_data = _payload("gone", range(0x80)), _payload("added", range(0x80, 0x100))
    gone = store.add(make_carton({"model/g.bin": gone_data})).digest
    fan = sha(gone_data)[:2]
    pause = store.blobs.path(fan + "0" * 62)   # sorts before every blob of its directory
    os.mkfifo(pause)
    store.blobs.path(sha(added_data)).parent.mkdir()   # listed by the scan before the add fills it
    outcome: dict[str, VerifyReport | BaseException] = {}

    def scan() -> None:
        try:
            with Store(store.root) as other:   # as `cartonstore verify` would, beside this process
                outcome["report"] = other.verify()
        except BaseException as e:  # noqa: BLE001 - the test's failure, read below
            outcome["report"] = e

    scanner = threading.Thread(target=scan)
    scanner.start()
    try:
        while True:   # the write end opens once verify holds the read end
            try:
                writer = os.open(pause, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as e:
                if e.errno != errno.ENXIO or not scanner.is_alive():
                    raise
                time.sleep(0.01)
        try:
            store.remove(gone)
            added = store.add(make_carton({"model/a.bin": added_data})).digest
        finally:
            os.close(writer)   # verify reads no bytes: the FIFO is a corrupt blob to it
    finally:
        scanner.join(60)
    report = outcome["report"]
    assert isinstance(report, VerifyReport), report
    assert report.missing_blobs == [] and report.unindexed_blobs == [], report
    assert report.corrupt_blobs == [pause.name]
    os.unlink(pause)
    assert store.verify().ok and store.index.missing_blobs(added) == []
