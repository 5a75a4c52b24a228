"""``cartonstore add hf://ORG/NAME[@REV]`` against a stand-in for the Hub
(tests/kit/hub_server.py: the Hub is not reachable here), checked against
the real huggingface_hub client downloading the same repository from it:
the files are byte-identical, the token stays on the Hub, each refusal of
the Hub is named, and bytes that are not a file's LFS sha256 leave the
store as it was. A cache the real client made is adopted in place and
still read by it offline."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.clikit import run
from kit.fetchkit import blob_files, tmp_files
from kit.hub_server import HubServer

from cartonstore.store import Store

TOKEN = "hf_accepted"


def safetensors(n: int) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    return struct.pack("<Q", len(header)) + header + os.urandom(4 * n)


FILES = {"config.json": b'{"model_type": "tiny"}', "tokenizer.json": b'{"vocab": {"a": 0}}',
         "model.safetensors": safetensors(50_000), "extra/adapter.bin": os.urandom(70_000)}


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    with HubServer() as server:
        server.add_repo("acme/tiny", FILES, refs=("main", "v1"))
        server.add_repo("acme/gated", {"model.safetensors": safetensors(10)}, token=TOKEN, gated=True)
        server.add_repo("acme/private", {"config.json": b"{}"}, token=TOKEN)
        server.add_repo("acme/holes", {"config.json": b"{}", "gone.bin": b"x" * 10})
        server.hide("acme/holes", "gone.bin")
        bad = safetensors(1000)
        server.add_repo("acme/bad", {"config.json": b"{}", "model.safetensors": bad})
        server.tamper(hashlib.sha256(bad).hexdigest(), safetensors(1000))
        server.add_repo("acme/badgit", {"config.json": b'{"a": 1}'})
        server.tamper_git("acme/badgit", "config.json", b'{"a": 2}')
        yield server


@pytest.fixture
def env(hub: HubServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """HF_ENDPOINT at the stand-in, no token, and private addresses refused
    to URLs a carton names (production's default: the endpoint is the
    operator's, so the Hub on 127.0.0.1 is reached all the same); returns
    the store's root."""
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("CARTONSTORE_ALLOW_PRIVATE_LINKS", "false")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return tmp_path / "root"


def add(capsys, root: Path, *argv: str) -> tuple[int, dict | str]:
    code, out, err = run(capsys, "add", *argv, "--root", str(root), "--json")
    return code, json.loads(out) if code == 0 else err


def model_files(capsys, root: Path, name: str) -> dict[str, bytes]:
    """The files of ``cartonstore path NAME``/model."""
    code, out, err = run(capsys, "path", name, "--root", str(root))
    assert code == 0, err
    model = Path(out.strip())
    return {str(p.relative_to(model / "model")): p.read_bytes() for p in (model / "model").rglob("*") if p.is_file()}


def test_the_files_are_huggingface_hubs_and_a_second_tag_fetches_nothing(capsys, env: Path, hub: HubServer,
                                                                          tmp_path: Path) -> None:
    from huggingface_hub import hf_hub_download, snapshot_download

    code, first = add(capsys, env, "hf://acme/tiny", "--name", "tiny")
    assert code == 0 and first["complete"] and first["blobs_fetched"] == 4, first
    commit = hub.repos["acme/tiny"].refs["main"]
    with Store(env) as store:
        row = store.index.carton(first["manifest_sha256"])
        assert row.source == f"hf://acme/tiny@{commit}" and row.model_name == "acme/tiny"
    ours = model_files(capsys, env, "tiny")
    snapshot = Path(snapshot_download("acme/tiny", endpoint=hub.endpoint, cache_dir=tmp_path / "hf-cache"))
    theirs = {str(p.relative_to(snapshot)): p.read_bytes() for p in snapshot.rglob("*") if p.is_file()}
    assert ours == theirs == FILES
    one = hf_hub_download("acme/tiny", "extra/adapter.bin", revision="v1", endpoint=hub.endpoint,
                          cache_dir=tmp_path / "hf-cache-2")
    assert Path(one).read_bytes() == ours["extra/adapter.bin"]

    code, again = add(capsys, env, "hf://acme/tiny@v1", "--name", "tiny-v1")   # another tag, the same commit
    assert code == 0 and again["manifest_sha256"] == first["manifest_sha256"]
    assert (again["bytes_received"], again["blobs_fetched"]) == (0, 0)
    assert all(r.headers.get("Authorization") is None for r in hub.cdn.requests)


def test_the_token_goes_to_the_hub_and_not_to_the_cdn(capsys, env: Path, hub: HubServer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    refused_before = len(hub.seen(path_part="/acme/gated"))
    code, err = add(capsys, env, "hf://acme/gated")
    assert code == 9 and f"accept the license at {hub.endpoint}/acme/gated" in err and "no token is set" in err
    assert Store(env).list() == []
    # the listing, then the file once: its refusal is read from that answer, not asked for again
    assert len(hub.seen(path_part="/acme/gated")) == refused_before + 2
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub_before, cdn_before = len(hub.seen(path_part="/acme/gated/")), len(hub.cdn.requests)
    code, out = add(capsys, env, "hf://acme/gated", "--name", "gated")
    assert code == 0 and out["complete"], out
    to_hub = hub.seen(path_part="/acme/gated/")[hub_before:]
    assert to_hub and all(r.authorization == f"Bearer {TOKEN}" for r in to_hub)
    to_cdn = hub.cdn.requests[cdn_before:]
    assert to_cdn and all(r.headers.get("Authorization") is None for r in to_cdn)


@pytest.mark.parametrize(("ref", "code", "said"), [
    ("hf://acme/nothing", 3, "acme/nothing: no such repository at {endpoint}"),
    ("hf://acme/private", 3, "acme/private: no such repository at {endpoint}, or a private one this token cannot "
                             "read (no token is set"),
    ("hf://acme/tiny@nope", 3, "acme/tiny: no revision 'nope' at {endpoint}"),
    ("hf://acme/holes", 3, "the Hub has no file 'gone.bin'"),
    ("hf://acme/bad", 5, "model.safetensors: the Hub's bytes are not those its LFS sha256"),
    ("hf://acme/badgit", 5, "config.json: its bytes are git object"),
    ("hf://acme/tiny?include=*.gguf", 4, "no file of commit"),
    ("hf://acme/../x", 4, "is not a Hub repository id"),
])
def test_each_refusal_is_named_and_the_store_is_unchanged(capsys, env: Path, hub: HubServer, ref: str, code: int,
                                                          said: str) -> None:
    got, err = add(capsys, env, ref)
    assert got == code and said.format(endpoint=hub.endpoint) in err, err
    with Store(env) as store:
        assert store.list() == [] and blob_files(store) == [] and tmp_files(store) == []


def test_lazy_and_evicted_files_come_back_from_the_recorded_resolve_urls(capsys, env: Path, hub: HubServer) -> None:
    code, out = add(capsys, env, "hf://acme/tiny", "--lazy", "--name", "tiny", "--exclude", "extra/")
    assert code == 0 and not out["complete"] and out["blobs_fetched"] == 2, out   # the git files, hashed
    commit = hub.repos["acme/tiny"].refs["main"]
    with Store(env) as store:
        digest = store.resolve("tiny")
        assert store.index.carton(digest).source == f"hf://acme/tiny@{commit}?exclude=extra%2F"
        missing = store.missing_blobs(digest)
        weights = hashlib.sha256(FILES["model.safetensors"]).hexdigest()
        assert missing == [weights]
        assert store.index.links_for(weights) == [f"{hub.endpoint}/acme/tiny/resolve/{commit}/model.safetensors"]
    assert model_files(capsys, env, "tiny") == {p: d for p, d in FILES.items() if not p.startswith("extra/")}
    code, _, err = run(capsys, "gc", "--max-size", "0", "--grace", "0s", "--root", str(env))   # evicts what has a source
    assert code == 0, err
    with Store(env) as store:
        assert weights in store.missing_blobs(digest)
    assert model_files(capsys, env, "tiny") == {p: d for p, d in FILES.items() if not p.startswith("extra/")}


def test_include_and_exclude_need_an_hf_source(capsys, env: Path) -> None:
    code, _, err = run(capsys, "add", "https://example.com/m.carton", "--include", "*.json", "--root", str(env))
    assert code == 4 and "--include and --exclude select files of an hf:// repository" in err


def test_a_daemon_loads_an_hf_source_and_names_a_refusal(hub: HubServer, tmp_path: Path) -> None:
    from kit.daemonkit import DaemonProcess, call

    with DaemonProcess(tmp_path / "root", listen=None, env={"HF_ENDPOINT": hub.endpoint}) as daemon:
        status, body = call(daemon, "POST", "/v2/repository/models/tiny/load",
                            json={"parameters": {"source": "hf://acme/tiny@v1"}})
        assert status == 200, body
        status, body = call(daemon, "POST", "/v2/repository/models/gated/load",
                            json={"parameters": {"source": "hf://acme/gated"}})
        assert status == 403 and f"accept the license at {hub.endpoint}/acme/gated" in body["error"], body
    with Store(tmp_path / "root") as store:
        assert [i.names for i in store.list()] == [["tiny"]] and store.missing_blobs(store.resolve("tiny")) == []


def test_a_file_that_breaks_off_resumes_with_a_range(capsys, env: Path, hub: HubServer) -> None:
    from kit.origin import Fault

    weights = safetensors(100_000)
    hub.add_repo("acme/flaky", {"model.safetensors": weights})
    path = f"/lfs/{hashlib.sha256(weights).hexdigest()}"
    hub.cdn.set_fault(path, Fault(truncate_at=150_000, times=1))
    code, out = add(capsys, env, "hf://acme/flaky", "--name", "flaky")
    assert code == 0 and out["complete"] and out["retries"] == 1, out
    assert [r.range for r in hub.cdn.requests if r.path == path] == [None, "bytes=150000-"]
    assert model_files(capsys, env, "flaky") == {"model.safetensors": weights}


def test_a_repository_of_one_onnx_graph_is_declared_for_the_onnx_runner(capsys, env: Path, hub: HubServer,
                                                                        tmp_path: Path) -> None:
    """The graph's inputs and outputs, as `pack` declares them, read once
    every file is staged."""
    from kit.runnerkit import onnx_model_dir

    from cartonstore.format.carton_toml import parse_carton_toml

    graph = (onnx_model_dir(tmp_path / "src", name="affine", ids=False) / "model" / "model.onnx").read_bytes()
    hub.add_repo("acme/affine", {"model.onnx": graph, "README.md": b"y = 2x + 1\n"})
    code, out = add(capsys, env, "hf://acme/affine", "--name", "affine")
    assert code == 0, out
    code, path, err = run(capsys, "path", "affine", "--root", str(env))
    assert code == 0, err
    declared = parse_carton_toml((Path(path.strip()) / "carton.toml").read_bytes())
    assert (declared.runner.runner_name, [i.name for i in declared.inputs or ()]) == ("onnx", ["x"])


def test_a_cache_huggingface_hub_made_is_adopted_in_place_and_hf_then_fetches_only_git_files(
        capsys, env: Path, hub: HubServer, tmp_path: Path) -> None:
    """The real client downloads into a fresh HF_HOME; adopted, its blobs are
    the store's (one inode), huggingface_hub still answers offline from its
    cache, and the same repository added by hf:// fetches none of the LFS
    bytes the store now has (a file kept in git is named by its git object
    id only, which the store does not index: it is fetched and hashed)."""
    from huggingface_hub import snapshot_download

    files = {"config.json": b'{"model_type": "cached"}', "model.safetensors": safetensors(60_000)}
    hub.add_repo("acme/cached", files)
    home = tmp_path / "hf-home"
    snapshot = Path(snapshot_download("acme/cached", endpoint=hub.endpoint, cache_dir=home / "hub"))
    repo = snapshot.parent.parent
    assert repo.name == "models--acme--cached"

    code, out, err = run(capsys, "adopt", str(repo), "--name", "cached", "--root", str(env), "--json")
    assert code == 0, err
    assert (json.loads(out)["files_linked"], json.loads(out)["bytes_copied"]) == (2, 0)
    with Store(env) as store:
        for blob in (repo / "blobs").iterdir():
            stored = store.blobs.path(hashlib.sha256(blob.read_bytes()).hexdigest())
            assert os.stat(blob).st_ino == os.stat(stored).st_ino
    code, out, err = run(capsys, "verify", "--root", str(env), "--json")
    assert code == 0 and json.loads(out)["ok"], out + err

    ask = "import sys; from huggingface_hub import hf_hub_download; print(hf_hub_download('acme/cached', sys.argv[1]))"
    offline = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    for path, data in files.items():
        done = subprocess.run([sys.executable, "-c", ask, path], capture_output=True, text=True, timeout=120,
                              env=offline)
        assert done.returncode == 0, done.stderr
        assert Path(done.stdout.strip()).read_bytes() == data

    lfs_before = len(hub.cdn.requests)
    code, added = add(capsys, env, "hf://acme/cached", "--name", "cached-hf")
    assert code == 0 and added["complete"], added
    assert added["bytes_received"] == len(files["config.json"]) and len(hub.cdn.requests) == lfs_before
    code, out, err = run(capsys, "ls", "--sources", "--json", "--root", str(env))
    assert code == 0, err
    hf = json.loads(out)["hf"]
    assert (hf["reused_bytes"], hf["reused_blobs"]) == (len(files["model.safetensors"]), 1)
    assert model_files(capsys, env, "cached-hf") == model_files(capsys, env, "cached") == files


def test_a_file_the_hub_lacks_cancels_a_git_file_being_staged_and_leaves_nothing(capsys, env: Path, hub: HubServer,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A sibling's 404 cancels the git file whose bytes are being staged in
    a thread: the add waits for that thread, discards what it staged, and
    the store and its tmp/ are as they were."""
    import time

    from cartonstore.store.content.blobs import BlobWriter

    hub.add_repo("acme/half", {"config.json": b'{"a": 1}', "gone.json": b"{}"})
    hub.hide("acme/half", "gone.json", after=0.2)   # config.json is staged by then, its thread still sleeping
    stage = BlobWriter.stage

    def slow_stage(self: BlobWriter, **kw: object) -> object:
        staged = stage(self, **kw)
        time.sleep(0.5)   # staged, its thread not yet returned, when the sibling's 404 cancels this file
        return staged

    monkeypatch.setattr(BlobWriter, "stage", slow_stage)
    code, out = add(capsys, env, "hf://acme/half", "--name", "half")
    assert code != 0 and "gone.json" in str(out)
    time.sleep(0.6)   # the thread staging config.json has ended either way
    with Store(env) as store:
        assert store.list() == [] and blob_files(store) == [] and tmp_files(store) == []


def test_two_git_files_with_the_same_bytes_are_one_blob(capsys, env: Path, hub: HubServer) -> None:
    hub.add_repo("acme/twins", {"a/config.json": b'{"twin": 1}', "b/config.json": b'{"twin": 1}',
                                "c.txt": b"other"})
    code, out = add(capsys, env, "hf://acme/twins", "--name", "twins")
    assert code == 0 and out["complete"], out
    files = model_files(capsys, env, "twins")
    assert files["a/config.json"] == files["b/config.json"] == b'{"twin": 1}' and files["c.txt"] == b"other"
    with Store(env) as store:   # the second copy's staged file is dropped, not left in tmp/
        assert hashlib.sha256(b'{"twin": 1}').hexdigest() in blob_files(store) and tmp_files(store) == []
