"""The pure parts of hf://: references and their globs, the Hub's listing,
the Hub's refusals in words, and which URLs the token goes to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kit.hub_server import git_oid

from cartonstore.config import load_config
from cartonstore.errors import InvalidInput, NotFound, PermissionDenied
from cartonstore.fetch.http.config import HubConfig
from cartonstore.hf.hub import hub_error
from cartonstore.hf.listing import parse_revision
from cartonstore.hf.reference import HubReference, parse_reference, with_patterns

COMMIT = "a" * 40
SHA = "b" * 64


@pytest.mark.parametrize(("text", "ref"), [
    ("hf://acme/tiny", HubReference("acme/tiny", "main")),
    ("HF://gpt2@v1.0", HubReference("gpt2", "v1.0")),
    ("hf://acme/tiny@refs/pr/1", HubReference("acme/tiny", "refs/pr/1")),
    ("hf://acme/tiny@main?include=*.json&include=tok/&exclude=*.bin",
     HubReference("acme/tiny", "main", ("*.json", "tok/"), ("*.bin",))),
])
def test_references(text: str, ref: HubReference) -> None:
    assert parse_reference(text) == ref
    assert parse_reference(str(ref)) == ref


@pytest.mark.parametrize(("text", "said"), [
    ("hf://", "is not a Hub repository id"),
    ("hf://a/b/c", "is not a Hub repository id"),
    ("hf://acme--x/y", "is not a Hub repository id"),
    ("hf://acm\u00e9/x", "is not a Hub repository id"),
    ("hf://acme/x@", "is not a revision"),
    ("hf://acme/x@a b", "is not a revision"),
    ("hf://acme/x?glob=*", "takes include=GLOB and exclude=GLOB only"),
    ("oci://acme/x", "is not an hf:// reference"),
])
def test_bad_references_are_named(text: str, said: str) -> None:
    with pytest.raises(InvalidInput, match=said.replace("*", r"\*")):
        parse_reference(text)


def test_globs_select_as_huggingface_hub_does() -> None:
    ref = parse_reference(with_patterns("hf://acme/x", ["*.json", "tok/"], ["tok/big*"]))
    assert [p for p in ("config.json", "tok/a.txt", "tok/big.bin", "model.bin", "sub/c.json") if ref.wants(p)] == \
        ["config.json", "tok/a.txt", "sub/c.json"]   # fnmatch's * crosses '/', as allow_patterns' does
    with pytest.raises(InvalidInput, match="select files of an hf:// repository"):
        with_patterns("https://h/m.carton", ["*.json"], [])


def listing(**doc: object) -> bytes:
    return json.dumps({"sha": COMMIT, "siblings": [], **doc}).encode()


def test_a_listing() -> None:
    siblings = [{"rfilename": "config.json", "size": 2, "blobId": git_oid(b"{}")},
                {"rfilename": "w.safetensors", "size": 9, "blobId": "c" * 40,
                 "lfs": {"sha256": SHA, "size": 9, "pointerSize": 134}}]
    revision = parse_revision(listing(siblings=siblings), HubReference("a/b"))
    assert revision.commit == COMMIT
    assert [(f.path, f.size, f.sha256, f.git_oid) for f in revision.files] == [
        ("config.json", 2, None, git_oid(b"{}")), ("w.safetensors", 9, SHA, None)]


@pytest.mark.parametrize(("raw", "said"), [
    (b"<html>", "not JSON"),
    (b"[]", "not a JSON object"),
    (listing(sha="main"), "'sha' is 'main', not a commit id"),
    (listing(siblings=None), "no 'siblings' list"),
    (listing(siblings=[{"rfilename": "a"}]), "a: size is None, not a size .*blobs=true"),
    (listing(siblings=[{"rfilename": "a", "size": -1}]), "a: size is -1"),
    (listing(siblings=[{"rfilename": "a", "size": 1, "blobId": "x"}]), "a: blobId is 'x'"),
    (listing(siblings=[{"rfilename": "a", "lfs": {"sha256": "x", "size": 1}}]), "a: lfs.sha256 is 'x'"),
    (listing(siblings=[{"rfilename": "a", "lfs": {"sha256": SHA, "size": True}}]), "a: lfs.size is True"),
    (listing(siblings=[{"name": "a"}]), "a sibling without an rfilename"),
    (listing(siblings=[{"rfilename": "../x", "size": 1}]), "file '../x' is not a path a model's file may have"),
    (listing(siblings=[{"rfilename": "/etc/passwd", "size": 1}]), "file '/etc/passwd' is not a path"),
    (listing(siblings=[{"rfilename": "a", "size": 1}, {"rfilename": "a", "size": 2}]), "file 'a' is listed twice"),
    (b'{"sha": "' + COMMIT.encode() + b'", "sha": "' + COMMIT.encode() + b'", "siblings": []}',
     "not JSON .*'sha' appears twice"),
])
def test_bad_listings_are_named(raw: bytes, said: str) -> None:
    with pytest.raises(InvalidInput, match="the Hub's listing of hf://a/b@main: " + said):
        parse_revision(raw, HubReference("a/b"))


@pytest.mark.parametrize(("status", "code", "token", "kind", "said"), [
    (401, "GatedRepo", False, PermissionDenied, "a/b is a gated repository: accept the license at https://hub/a/b"),
    (403, "GatedRepo", True, PermissionDenied, "accept the license at https://hub/a/b, with the account whose token"),
    (401, "RepoNotFound", False, NotFound, "a/b: no such repository at https://hub, or a private one"),
    (404, "RevisionNotFound", True, NotFound, "a/b: no revision 'main' at https://hub"),
    (404, "EntryNotFound", True, NotFound, "a/b@main: the Hub has no file 'w.bin'"),
    (401, None, False, PermissionDenied, "answered 401 Unauthorized: it needs a token: set HF_TOKEN"),
    (401, None, True, PermissionDenied, "answered 401 Unauthorized: it refused the token"),
    (403, None, True, PermissionDenied, "answered 403 Forbidden"),
])
def test_the_hubs_refusals_in_words(status: int, code: str | None, token: bool, kind: type, said: str) -> None:
    error = hub_error(status, code, HubReference("a/b"), "https://hub", token=token, file="w.bin")
    assert type(error) is kind and said in error.message
    assert ("no token is set" in error.message) == (not token and code in ("GatedRepo", "RepoNotFound"))


def test_other_statuses_are_not_the_hubs_to_name() -> None:
    assert hub_error(500, None, HubReference("a/b"), "https://hub", token=False) is None


def test_the_token_is_for_the_endpoint_only() -> None:
    hub = HubConfig("https://hub.lab/hf", "hf_x")
    assert hub.authorization_for("https://hub.lab:443/hf/api/models/a/b") == "Bearer hf_x"
    for elsewhere in ("https://cdn.hub.lab/hf/a", "http://hub.lab/hf/a", "https://hub.lab:8443/hf/a",
                      "https://hub.lab/other/a", "https://hub.lab/hfx/a", "https://hub.lab:x/hf"):
        assert hub.authorization_for(elsewhere) is None, elsewhere
    assert HubConfig("https://hub.lab").authorization_for("https://hub.lab/a") is None   # no token, no header


def test_hf_token_wins_over_the_token_file(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("hf_from_file\n")
    path = tmp_path / "c.toml"
    path.write_text(f'[hf]\nendpoint = "http://127.0.0.1:9/"\ntoken_file = "{tmp_path / "token"}"\n')
    assert load_config(path, env={}).fetch_config().hub == HubConfig("http://127.0.0.1:9", "hf_from_file")
    env = {"HF_TOKEN": "hf_env", "HF_ENDPOINT": "https://mirror.lab"}
    assert load_config(path, env=env).fetch_config().hub == HubConfig("https://mirror.lab", "hf_env")
