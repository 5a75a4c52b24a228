"""``cartonstore adopt``: a Hugging Face cache repository, an Ollama models
directory and a plain directory stored without a second copy of their
bytes, each file verified; the other tool keeps working (the real
huggingface_hub reads its cache offline); a file changed later through the
other tool's path is never served; hostile trees are refused by name with
the store unchanged.

The Hugging Face cache is built in the layout huggingface_hub writes
(kit/adoptkit.py): the Hub is not reachable from the tests."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest
from conftest import snapshot
from kit.adoptkit import (
    COMMIT,
    GGUF,
    HF_FILES,
    PARAMS,
    REPO,
    TEMPLATE,
    git_blob_sha1,
    hf_cache,
    ollama_dir,
    ollama_model,
    safetensors,
)
from kit.clikit import run

from cartonstore.errors import IntegrityError, InvalidInput, NotFound, Unavailable
from cartonstore.sources.adoptable import AdoptableFile, read_adoptable
from cartonstore.store import Store
from cartonstore.store.adoption import AdoptResult, _Staged, adopt
from cartonstore.store.content.blobs import BLOB_MODE
from cartonstore.store.gc.plan import GcPolicy
from cartonstore.store.ingest import IngestResult

NOBODY = 65534


def same_inode(a: Path, b: Path) -> bool:
    sa, sb = os.stat(a), os.stat(b)
    return (sa.st_ino, sa.st_dev) == (sb.st_ino, sb.st_dev)


# -- adopted in place -----------------------------------------------------------

def test_a_hugging_face_cache_is_adopted_in_place_and_huggingface_hub_still_reads_it(store: Store,
                                                                                        tmp_path: Path) -> None:
    repo = hf_cache(tmp_path / "hub")
    result = store.adopt(repo)
    assert (result.files_linked, result.files_copied) == (3, 0)
    (model,) = result.models
    assert (model.model_name, model.naming.name if model.naming else None) == (REPO, "acme-tiny-model")
    for blob in (repo / "blobs").iterdir():
        assert same_inode(blob, store.blobs.path(hashlib.sha256(blob.read_bytes()).hexdigest()))
    directory = store.materialize("acme-tiny-model")
    for path, data in HF_FILES.items():
        assert (directory / "model" / path).read_bytes() == data
    assert store.config_of(model.digest).runner.runner_name == "safetensors"
    assert store.info(model.digest).row.source == f"adopted:{repo}@{COMMIT}"
    assert store.verify().ok
    # huggingface_hub, offline, answers from its cache as before (blobs now read-only)
    code = ("import sys; from huggingface_hub import hf_hub_download; "
            f"print(hf_hub_download({REPO!r}, sys.argv[1], cache_dir=sys.argv[2]))")
    for path, data in HF_FILES.items():
        done = subprocess.run([sys.executable, "-c", code, path, str(tmp_path / "hub")], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert done.returncode == 0, done.stderr
        assert Path(done.stdout.strip()).read_bytes() == data


def test_a_snapshot_is_its_commit_of_the_repository_and_the_hub_directory_is_refused(store: Store,
                                                                                         tmp_path: Path) -> None:
    repo = hf_cache(tmp_path / "hub")
    assert store.adopt(repo / "snapshots" / COMMIT).models[0].digest == store.adopt(repo).models[0].digest
    with pytest.raises(InvalidInput, match=f"{tmp_path / 'hub'} holds Hugging Face cache repositories: adopt each"):
        store.adopt(tmp_path / "hub")


def test_an_ollama_directory_is_a_model_per_manifest_with_its_layers_named(store: Store, tmp_path: Path) -> None:
    models = ollama_dir(tmp_path)
    result = store.adopt(models)
    assert sorted(m.naming.name for m in result.models if m.naming) == ["tiny-latest", "tiny-q4"]
    assert result.files_linked == 3   # gguf, template, params: each once for both tags (one carton)
    directory = store.materialize("tiny-q4")
    assert (directory / "model" / "model.gguf").read_bytes() == GGUF
    assert (directory / "model" / "template").read_bytes() == TEMPLATE
    assert (directory / "model" / "params.json").read_bytes() == PARAMS
    assert sorted(os.listdir(directory / "model")) == ["model.gguf", "params.json", "template"]
    gguf_digest = hashlib.sha256(GGUF).hexdigest()
    assert same_inode(models / "blobs" / f"sha256-{gguf_digest}", store.blobs.path(gguf_digest))
    assert store.config_of(result.models[0].digest).runner.runner_name == "gguf"
    assert store.verify().ok


def test_a_plain_directory_through_the_cli_with_a_name_and_json(tmp_path: Path, capsys) -> None:
    plain = tmp_path / "weights"
    (plain / "sub").mkdir(parents=True)
    (plain / "model.safetensors").write_bytes(safetensors())
    (plain / "sub" / "notes.txt").write_bytes(b"notes")
    (plain / "sub" / "same-notes.txt").write_bytes(b"notes")
    root = tmp_path / "root"
    code, out, err = run(capsys, "adopt", str(plain), "--name", "mine", "--root", str(root), "--json")
    assert code == 0, err
    said = json.loads(out)
    assert (said["files_linked"], said["files_present"], said["bytes_copied"]) == (2, 1, 0)
    assert (said["models"][0]["name"], said["models"][0]["files"]) == ("mine", 3)
    code, out, err = run(capsys, "path", "mine", "--root", str(root))
    assert code == 0, err
    served = Path(out.strip()) / "model" / "sub" / "notes.txt"   # one of the two files is the blob: whichever came first
    assert same_inode(served, plain / "sub" / "notes.txt") or same_inode(served, plain / "sub" / "same-notes.txt")


def test_across_filesystems_the_bytes_are_copied_and_the_result_says_how_many(store: Store) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(store.layout.tmp_dir).st_dev:
        pytest.skip("no second filesystem (/dev/shm) to adopt from")
    top = Path(shm / f"cartonstore-adopt-{os.getpid()}")
    try:
        repo = hf_cache(top)
        result = store.adopt(repo)
        size = sum(len(d) for d in HF_FILES.values())
        assert (result.files_linked, result.files_copied, result.bytes_copied + result.bytes_reflinked) == (0, 3, size)
        assert store.verify().ok
    finally:
        shutil.rmtree(top)


# -- changed later through the other tool's path --------------------------------

def test_a_file_changed_through_the_other_path_is_caught_by_verify_and_never_served(store: Store,
                                                                                       tmp_path: Path) -> None:
    repo = hf_cache(tmp_path / "hub")
    digest = store.adopt(repo).models[0].digest
    store.materialize(digest)
    lfs = repo / "blobs" / hashlib.sha256(HF_FILES["model.safetensors"]).hexdigest()
    os.chmod(lfs, 0o644)   # the other tool's owner may make it writable again, and write in place
    with open(lfs, "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 8)
    assert store.verify().corrupt_blobs == [lfs.name]
    with pytest.raises(IntegrityError, match=f"adopted from {lfs}, was changed"):
        store.materialize(digest)
    assert store.layout.model_path(digest).exists() is False
    assert not store.blobs.has(lfs.name)   # quarantined: the carton now lacks it, as after verify --repair
    with pytest.raises(NotFound, match="missing 1 blob"):
        store.materialize(digest)


def test_a_touched_file_with_its_bytes_intact_is_still_served(store: Store, tmp_path: Path) -> None:
    repo = hf_cache(tmp_path / "hub")
    digest = store.adopt(repo).models[0].digest
    config = repo / "blobs" / git_blob_sha1(HF_FILES["config.json"])
    os.utime(config, ns=(1, 1))
    assert (store.materialize(digest) / "model" / "config.json").read_bytes() == HF_FILES["config.json"]


# -- hostile trees: refused by name, store unchanged ----------------------------

def _symlink_out(repo: Path, outside: Path) -> str:
    outside.write_bytes(b"secret")
    link = repo / "snapshots" / COMMIT / "config.json"
    link.unlink()
    link.symlink_to(outside)
    return "config.json is a symlink out of"


def _lfs_mismatch(repo: Path, outside: Path) -> str:
    blob = repo / "blobs" / hashlib.sha256(HF_FILES["model.safetensors"]).hexdigest()
    blob.write_bytes(safetensors(2048))
    return f"model.safetensors: the bytes of {blob} do not match its name: named for sha256"


def _git_mismatch(repo: Path, outside: Path) -> str:
    blob = repo / "blobs" / git_blob_sha1(HF_FILES["tokenizer/vocab.txt"])
    blob.write_bytes(b"x\ny\nz\n")
    return f"tokenizer/vocab.txt: the bytes of {blob} do not match its name: named for git-sha1"


@pytest.mark.parametrize("spoil", [_symlink_out, _lfs_mismatch, _git_mismatch])
def test_a_hostile_hugging_face_cache_is_refused_by_name_and_nothing_changes(store: Store, tmp_path: Path,
                                                                            spoil) -> None:
    repo = hf_cache(tmp_path / "hub")
    expected = spoil(repo, tmp_path / "outside")
    modes = {p: os.stat(p).st_mode for p in (repo / "blobs").iterdir()}
    before = snapshot(store.root)
    with pytest.raises((InvalidInput, IntegrityError), match=expected):
        store.adopt(repo)
    assert snapshot(store.root) == before
    assert {p: os.stat(p).st_mode for p in (repo / "blobs").iterdir()} == modes   # linked ones given back as they were


def test_a_hostile_ollama_directory_is_refused_by_name_and_nothing_changes(store: Store, tmp_path: Path) -> None:
    models = ollama_dir(tmp_path, tags=("latest",))
    manifest = models / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    before = snapshot(store.root)
    doc = json.loads(manifest.read_text())
    doc["layers"][1]["digest"] = "sha256:../../../etc/passwd"
    manifest.write_text(json.dumps(doc))
    with pytest.raises(InvalidInput, match=r"the digest of template, 'sha256:\.\./\.\./\.\./etc/passwd', is not "
                                           r"sha256:<64 hex digits> \(a path with '\.\.' would leave blobs/\)"):
        store.adopt(models)
    doc["layers"][1]["digest"] = "sha256:" + hashlib.sha256(TEMPLATE).hexdigest()
    manifest.write_text(json.dumps(doc))
    gguf = models / "blobs" / f"sha256-{hashlib.sha256(GGUF).hexdigest()}"
    gguf.write_bytes(GGUF[:-1] + b"\x02")
    with pytest.raises(IntegrityError, match=f"model.gguf: the bytes of {gguf} do not match its name"):
        store.adopt(models)
    assert snapshot(store.root) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a file only root may read, adopted by uid 65534")
def test_a_file_the_caller_may_not_read_is_refused_by_name(short_tmp: Path) -> None:
    os.chmod(short_tmp, 0o755)
    repo = hf_cache(short_tmp / "hub")
    for dirpath, _dirnames, _filenames in os.walk(short_tmp / "hub"):
        os.chmod(dirpath, 0o755)
    secret = repo / "blobs" / hashlib.sha256(HF_FILES["model.safetensors"]).hexdigest()
    os.chmod(secret, 0o600)
    theirs = short_tmp / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    done = subprocess.run([sys.executable, "-m", "cartonstore.cli", "adopt", str(repo), "--root", str(theirs / "root")],
                          user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True, text=True, timeout=60,
                          cwd="/")
    assert done.returncode == 9, done.stderr
    assert f"model.safetensors: this user may not read {secret}" in done.stderr
    with Store(theirs / "root", read_only=True) as s:
        assert s.list() == [] and list(s.blobs.iter_digests()) == []


def test_a_directory_of_one_onnx_graph_is_adopted_as_a_carton_the_onnx_runner_serves(store: Store,
                                                                                      tmp_path: Path) -> None:
    from kit.runnerkit import onnx_model_dir

    from cartonstore.format.carton_toml import parse_carton_toml

    graph = onnx_model_dir(tmp_path / "src", name="affine", ids=False) / "model" / "model.onnx"
    top = tmp_path / "affine"
    top.mkdir()
    shutil.copyfile(graph, top / "model.onnx")
    (model,) = store.adopt(top).models
    (toml,) = [e.digest for e in store.index.entries(model.digest) if e.path == "carton.toml"]
    declared = parse_carton_toml(store.blobs.path(toml).read_bytes())
    assert (declared.runner.runner_name, [i.name for i in declared.inputs or ()]) == ("onnx", ["x"])
    assert os.stat(top / "model.onnx").st_ino == os.stat(store.blobs.path(hashlib.sha256(
        (top / "model.onnx").read_bytes()).hexdigest())).st_ino


# -- one inode, two store paths; a file swapped between the steps ---------------

def _one_file(tmp_path: Path, data: bytes = b"weights" * 100) -> tuple[AdoptableFile, str]:
    plain = tmp_path / "weights"
    plain.mkdir()
    (plain / "w.bin").write_bytes(data)
    os.chmod(plain / "w.bin", 0o644)
    (f,) = read_adoptable(plain)[0].files
    return f, hashlib.sha256(data).hexdigest()


def test_a_second_link_of_one_file_dropped_leaves_the_blob_read_only(store: Store, tmp_path: Path) -> None:
    """Two adopts of one file both link its inode into tmp/: the one that
    drops its link (it failed, or found the blob committed) leaves the mode
    alone, for the inode is the other's blob."""
    f, digest = _one_file(tmp_path)
    st = os.stat(f.disk)
    first, second, third = (_Staged(store, AdoptResult())._link(f, st, digest) for _ in range(3))
    second[0].discard()            # failed while the first is still to be committed
    store.blobs.commit(first[0])
    store.blobs.commit(third[0])   # found the first's blob there
    assert stat.S_IMODE(os.stat(store.blobs.path(digest)).st_mode) == BLOB_MODE
    assert [p.name for p in store.layout.tmp_dir.iterdir() if p.name.endswith("-adopt")] == []


def test_a_file_replaced_between_its_hash_and_its_link_is_neither_linked_nor_chmodded(store: Store,
                                                                                      tmp_path: Path) -> None:
    f, digest = _one_file(tmp_path)
    os.chmod(f.disk, 0o600)
    hashed = os.stat(f.disk)
    other = f.disk.with_name("other")
    other.write_bytes(b"another file")
    os.chmod(other, 0o640)
    os.replace(other, f.disk)
    with pytest.raises(IntegrityError, match=f"w.bin: {f.disk} was replaced while it was being adopted"):
        _Staged(store, AdoptResult())._link(f, hashed, digest)
    assert stat.S_IMODE(os.stat(f.disk).st_mode) == 0o640
    assert [p.name for p in store.layout.tmp_dir.iterdir() if p.name.endswith("-adopt")] == []


def test_a_directory_swapped_for_a_symlink_after_listing_is_not_read_through(store: Store, tmp_path: Path) -> None:
    plain = tmp_path / "weights"
    (plain / "sub").mkdir(parents=True)
    (plain / "sub" / "w.bin").write_bytes(b"weights")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "w.bin").write_bytes(b"secret")
    (model,) = read_adoptable(plain)
    (plain / "sub").rename(plain / "listed")
    (plain / "sub").symlink_to(outside)
    staged = _Staged(store, AdoptResult())
    try:
        with pytest.raises(Unavailable, match=f"sub/w.bin: {plain / 'sub' / 'w.bin'} is not the file listed"):
            staged.take_all(model.files)
        assert hashlib.sha256(b"secret").hexdigest() not in staged.staging.staged
    finally:
        staged.staging.discard()
    assert stat.S_IMODE(os.stat(outside / "w.bin").st_mode) != BLOB_MODE


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a file of root's that uid 65534 may link but not chmod")
def test_a_file_linked_but_not_the_callers_to_chmod_is_copied(short_tmp: Path) -> None:
    os.chmod(short_tmp, 0o755)
    plain = short_tmp / "weights"
    plain.mkdir()
    (plain / "w.bin").write_bytes(b"weights" * 100)
    os.chmod(plain / "w.bin", 0o666)   # others may read and write it, so protected_hardlinks lets them link it
    theirs = short_tmp / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    done = subprocess.run([sys.executable, "-m", "cartonstore.cli", "adopt", str(plain), "--root", str(theirs / "root"),
                           "--json"], user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True, text=True,
                          timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert (json.loads(done.stdout)["files_linked"], json.loads(done.stdout)["files_copied"]) == (0, 1)
    assert stat.S_IMODE(os.stat(plain / "w.bin").st_mode) == 0o666
    assert os.stat(plain / "w.bin").st_nlink == 1


class _Crash(Exception):
    pass


def test_the_adopted_rows_are_in_the_commits_transaction(store: Store, tmp_path: Path) -> None:
    """A crash right after the carton's commit leaves its adopted blobs
    known as adopted: a later change through the other path is caught."""
    repo = hf_cache(tmp_path / "hub")

    def commit_then_crash(*args, **kwargs) -> NoReturn:
        store.commit_checked(*args, **kwargs)
        raise _Crash

    with pytest.raises(_Crash):
        adopt(store, repo, name=None, commit=commit_then_crash)
    lfs = repo / "blobs" / hashlib.sha256(HF_FILES["model.safetensors"]).hexdigest()
    os.chmod(lfs, 0o644)
    with open(lfs, "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 8)
    with pytest.raises(IntegrityError, match=f"adopted from {lfs}, was changed"):
        store.materialize("acme-tiny-model")


def test_a_store_failure_at_the_second_model_names_the_first_one_kept(store: Store, tmp_path: Path) -> None:
    models = ollama_dir(tmp_path)
    commits = []

    def full_disk_at_the_second(*args, **kwargs) -> IngestResult:
        if commits:
            raise Unavailable("no space left on the device")
        commits.append(store.commit_checked(*args, **kwargs))
        return commits[-1]

    with pytest.raises(Unavailable) as caught:
        adopt(store, models, name=None, commit=full_disk_at_the_second)
    (first,) = commits
    assert str(caught.value) == ("no space left on the device; the models adopted before it are kept: "
                                 f"tiny:latest ({first.digest})")
    assert [m["manifest_sha256"] for m in caught.value.details["adopted"]] == [first.digest]
    assert [c.row.digest for c in store.list()] == [first.digest]


def test_gc_leaves_an_adopted_blob_the_other_tool_still_holds(store: Store, tmp_path: Path) -> None:
    """Removing it frees nothing, and its local source would bring it back
    as a copy: eviction does not take it, and max_size does not count it."""
    repo = hf_cache(tmp_path / "hub")
    (model,) = store.adopt(repo).models
    budget = sum(os.stat(store.blobs.path(e.digest)).st_size for e in store.index.entries(model.digest)
                 if e.path in ("MANIFEST", "carton.toml"))
    report = store.collect(GcPolicy(max_size=budget + 1024, grace=0))
    assert (report.evicted_blobs, report.over_budget) == (0, None)
    assert store.materialize(model.digest).is_dir()
    for blob in (repo / "blobs").iterdir():
        assert same_inode(blob, store.blobs.path(hashlib.sha256(blob.read_bytes()).hexdigest()))


def test_an_ollama_model_pulled_and_adopted_is_one_carton(store: Store, tmp_path: Path, origin) -> None:
    """Both name the layers from one table (format/ollama.py), and leave the
    manifest's config (an image config) out."""
    from kit import modelkit_oci as mk
    from kit.fetchkit import fast_config
    from kit.ocikit import pull

    artifact = mk.ollama([("model", GGUF), ("template", TEMPLATE), ("params", PARAMS), ("license", b"L1"),
                          ("license", b"L2"), ("system", b"be brief"), ("messages", b"[]")])
    pulled = pull(store, mk.serve(origin, artifact), fast_config(), name="pulled")
    models = ollama_model(tmp_path / "models", artifact.manifest, artifact.blobs, "r", "t")
    (adopted,) = store.adopt(models).models
    assert adopted.digest == pulled.digest
    assert sorted(e.path for e in store.index.entries(adopted.digest)) == [
        "carton.toml", "model/LICENSE", "model/LICENSE-2", "model/messages.json", "model/model.gguf",
        "model/params.json", "model/system.txt", "model/template"]


def test_an_ollama_layer_of_a_kind_not_read_is_refused_by_name(store: Store, tmp_path: Path) -> None:
    models = ollama_dir(tmp_path, tags=("latest",))
    manifest = models / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    doc = json.loads(manifest.read_text())
    doc["layers"][2]["mediaType"] = "application/vnd.ollama.image.embed"
    manifest.write_text(json.dumps(doc))
    before = snapshot(store.root)
    with pytest.raises(InvalidInput, match=rf"Ollama manifest {manifest}: layer 2: media type "
                                           r"'application/vnd.ollama.image.embed' is not an Ollama layer read here"):
        store.adopt(models)
    assert snapshot(store.root) == before
