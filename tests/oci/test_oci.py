"""Cartons as OCI artifacts (issue 12 §1), against a real distribution
registry: push, add (by tag and by digest), dedup on push, mounts, chunked
uploads, blobs evicted and fetched again, Basic auth from docker's config
and from registries.auth_file, and the registry's own view of what was
pushed."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import manifest_for, sha, snapshot
from kit.ocikit import BIG, FILES, config, make_cert, materialize, pull, push
from kit.registrykit import PASSWORD, USER, Registry, needs_registry

from cartonstore.errors import FetchError, InvalidInput
from cartonstore.oci.artifact import ARTIFACT_TYPE, TITLE
from cartonstore.store import Store
from cartonstore.store.gc.plan import GcPolicy

pytestmark = needs_registry

@pytest.fixture
def registry(tmp_path: Path, monkeypatch) -> Iterator[Registry]:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    with Registry(tmp_path / "registry") as r:
        yield r


@pytest.fixture
def pushed(tmp_path: Path, registry: Registry, make_carton) -> Iterator[tuple[Path, str, Any]]:
    source = Store(tmp_path / "source")
    digest = source.add(make_carton(FILES), name="m").digest
    result = push(source, "m", registry.ref("models/m:v1"), config())
    yield source, digest, result
    source.close()


def test_push_then_add_by_tag_and_by_digest(tmp_path: Path, registry: Registry, pushed) -> None:
    _source, digest, result = pushed
    assert result.carton == digest and result.uploaded == 5 and result.present == 0   # 4 blobs + config
    assert result.bytes_uploaded == result.bytes_total
    manifest = json.loads(registry.manifest("models/m", "v1"))
    assert manifest["artifactType"] == ARTIFACT_TYPE
    titles = [layer["annotations"][TITLE] for layer in manifest["layers"]]
    assert titles[:2] == ["carton.toml", "MANIFEST"] and set(titles) == {*FILES, "MANIFEST"}
    assert all(layer["digest"] == f"sha256:{sha(FILES[layer['annotations'][TITLE]])}"
               for layer in manifest["layers"] if layer["annotations"][TITLE] != "MANIFEST")
    assert result.reference.endswith("@sha256:" + hashlib.sha256(registry.manifest("models/m", "v1")).hexdigest())

    with Store(tmp_path / "a") as a:
        r = pull(a, registry.ref("models/m:v1"), config(), name="x")
        assert r.digest == digest and r.complete and r.sources["registry"]["blobs"] >= 4
        model = materialize(a, "x")
        assert {p: (model / p).read_bytes() for p in FILES} == FILES
        assert a.verify().ok
        assert a.index.carton(digest).source == result.reference   # tag and manifest digest recorded
    with Store(tmp_path / "b") as b:
        assert pull(b, result.reference.split(":v1")[0] + "@" + result.reference.split("@")[1],
                    config()).digest == digest


def test_an_add_from_a_registry_counts_oci_bytes_and_what_the_store_had(tmp_path: Path, registry: Registry,
                                                                        pushed, make_carton) -> None:
    """The store holds the artifact's big file already (a local add, which
    counts in no figures): the pull fetches the rest from the registry and
    counts the big file as reused."""
    _source, _digest, result = pushed
    toml = FILES["carton.toml"].replace(b'"tiny"', b'"other"')
    with Store(tmp_path / "a") as a:
        a.add(make_carton({"carton.toml": toml, "model/weights.bin": BIG}))
        assert not any(f.fetched_blobs or f.reused_blobs for f in a.source_bytes())
        pull(a, result.reference, config())
        oci = next(f for f in a.source_bytes() if f.kind == "oci")
        assert (oci.fetched_bytes, oci.fetched_blobs) == (len(FILES["carton.toml"]) + len(FILES["model/vocab.txt"])
                                                          + len(manifest_for(FILES)), 3)
        assert (oci.reused_bytes, oci.reused_blobs) == (len(BIG), 1)


def test_a_puller_reads_oci_only_when_built_with_that_kind(tmp_path: Path, registry: Registry, pushed) -> None:
    """The kinds a Puller reads are the ones it is built with: one with
    fetch's own (carton URLs) refuses a reference it could otherwise reach,
    naming the scheme; the standard one (the CLI's, the daemon's: their own
    test below) adds it."""
    from kit.fetchkit import URLS_ONLY
    from kit.fetchkit import pull as pull_with

    _source, digest, result = pushed
    with Store(tmp_path / "a") as a:
        with pytest.raises(InvalidInput, match=r"scheme 'oci' is not allowed \(the schemes read here: http, https\)"):
            pull_with(a, result.reference, config(), sources=URLS_ONLY)
        assert a.index.carton(digest) is None and not list(a.blobs.iter_digests())
        assert pull(a, result.reference, config()).digest == digest


def test_a_second_push_sends_nothing_and_a_shared_carton_sends_only_what_is_new(
        tmp_path: Path, registry: Registry, pushed, make_carton) -> None:
    source, _digest, _ = pushed
    again = push(source, "m", registry.ref("models/m:v2"), config())
    assert again.uploaded == 0 and again.present == 5 and again.bytes_uploaded == 0
    source.add(make_carton({**FILES, "model/extra.bin": b"new" * 1000}), name="m2")
    shared = push(source, "m2", registry.ref("models/m:v3"), config())
    # new: the extra file, the new MANIFEST; nothing else
    assert shared.uploaded == 2 and shared.bytes_uploaded < 4000 + 1000


def test_push_to_another_repository_mounts_instead_of_uploading(tmp_path: Path, registry: Registry,
                                                                 pushed) -> None:
    source, _digest, _ = pushed
    other = push(source, "m", registry.ref("team/other:v1"), config())
    assert other.mounted == 4 and other.bytes_uploaded < 10   # only the 2-byte config was not known from here
    assert registry.has_blob("team/other", sha(BIG))


def test_evicted_blobs_come_back_from_the_registry(tmp_path: Path, registry: Registry, pushed) -> None:
    _source, digest, _ = pushed
    with Store(tmp_path / "a") as a:
        pull(a, registry.ref("models/m:v1"), config(), name="x")
        report = a.collect(GcPolicy(max_size=1, grace=0.0))
        assert a.missing_blobs(digest)
        assert report.evicted_blobs and not report.kept_unrecoverable   # every blob has the registry as a source
        model = materialize(a, "x", config())
        assert (model / "model/weights.bin").read_bytes() == BIG and a.verify().ok


def test_a_big_blob_is_pushed_in_chunks(tmp_path: Path, registry: Registry, pushed) -> None:
    # 3 MiB at 1 MiB chunks went as PATCHes; the registry holds exactly the bytes.
    assert registry.has_blob("models/m", sha(BIG))
    with Store(tmp_path / "a") as a:
        pull(a, registry.ref("models/m:v1"), config(chunk_size=64 << 20))
        assert a.blobs.path(sha(BIG)).read_bytes() == BIG


# -- auth ----------------------------------------------------------------------------------


@pytest.fixture
def locked(tmp_path: Path, monkeypatch) -> Iterator[Registry]:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    with Registry(tmp_path / "registry", htpasswd=True) as r:
        yield r


def docker_config(path: Path, authority: str, user: str = USER, password: str = PASSWORD) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    (path / "config.json").write_text(json.dumps({"auths": {authority: {"auth": token}}}))
    return path / "config.json"


def test_basic_auth_credentials_from_docker_config(tmp_path: Path, locked: Registry, make_carton) -> None:
    docker_config(tmp_path / "docker", locked.authority)
    with Store(tmp_path / "s") as s:
        digest = s.add(make_carton(FILES), name="m").digest
        assert push(s, "m", locked.ref("models/m:v1"), config()).uploaded == 5
    with Store(tmp_path / "a") as a:
        assert pull(a, locked.ref("models/m:v1"), config()).digest == digest


def test_basic_auth_credentials_from_the_auth_file_setting(tmp_path: Path, locked: Registry,
                                                           make_carton) -> None:
    auth_file = docker_config(tmp_path / "cartonstore", f"https://{locked.authority}/v1/")
    with Store(tmp_path / "s") as s:
        s.add(make_carton(FILES), name="m")
        assert push(s, "m", locked.ref("models/m:v1"), config(auth_file=auth_file)).uploaded == 5


def test_no_credentials_and_wrong_credentials_are_named_and_store_nothing(
        tmp_path: Path, locked: Registry, make_carton) -> None:
    docker_config(tmp_path / "docker", locked.authority)
    with Store(tmp_path / "s") as s:
        s.add(make_carton(FILES), name="m")
        push(s, "m", locked.ref("models/m:v1"), config())
    (tmp_path / "docker" / "config.json").unlink()
    with Store(tmp_path / "a") as a:
        before = snapshot(a.root)
        with pytest.raises(FetchError, match="asks for a user and password, and none is configured for "
                                             f"{locked.authority}"):
            pull(a, locked.ref("models/m:v1"), config())
        docker_config(tmp_path / "docker", locked.authority, password="wrong")
        with pytest.raises(FetchError, match="refused"):
            pull(a, locked.ref("models/m:v1"), config())
        assert snapshot(a.root) == before


# -- the Bearer token flow -------------------------------------------------------------------


def test_bearer_tokens_anonymous_are_asked_once_per_scope(tmp_path: Path, registry: Registry, make_carton) -> None:
    from kit.tokenproxy import TokenProxy

    with TokenProxy(registry.authority) as proxy, Store(tmp_path / "s") as s:
        digest = s.add(make_carton(FILES), name="m").digest
        target = f"oci://{proxy.authority}/models/m:v1"
        assert push(s, "m", target, config()).uploaded == 5
        with Store(tmp_path / "a") as a:
            assert pull(a, target, config()).digest == digest
        scopes = [r["scopes"] for r in proxy.token_requests]
        assert ["repository:models/m:pull,push"] in scopes and ["repository:models/m:pull"] in scopes
        assert len(scopes) <= 4 and all(r["service"] == "test-registry" and r["user"] is None
                                        for r in proxy.token_requests)


def test_bearer_tokens_with_credentials(tmp_path: Path, registry: Registry, make_carton) -> None:
    from kit.tokenproxy import TokenProxy

    with TokenProxy(registry.authority, require_user=True) as proxy, Store(tmp_path / "s") as s:
        s.add(make_carton(FILES), name="m")
        target = f"oci://{proxy.authority}/models/m:v1"
        with pytest.raises(FetchError, match=f"token service http://{proxy.authority}/token refused a token "
                                             "anonymously for repository:models/m:pull,push"):
            push(s, "m", target, config())
        docker_config(tmp_path / "no-docker-config", proxy.authority)
        assert push(s, "m", target, config()).uploaded == 5
        assert proxy.token_requests and all(r["user"] == USER for r in proxy.token_requests)


# -- the CLI and the daemon ------------------------------------------------------------------


def test_cli_push_and_add_and_a_daemon_load_by_oci_source(tmp_path: Path, registry: Registry, daemon,
                                                          capsys) -> None:
    from conftest import FIXTURE_CARTON, FIXTURE_DIGEST
    from kit.daemonkit import call

    from cartonstore.cli.commands import main

    root = str(tmp_path / "cli")
    assert main(["--root", root, "add", str(FIXTURE_CARTON), "--name", "fx"]) == 0
    capsys.readouterr()
    assert main(["--root", root, "push", "fx", registry.ref("models/fx:v1"), "--json"]) == 0
    pushed = json.loads(capsys.readouterr().out)
    assert pushed["carton"] == FIXTURE_DIGEST and pushed["uploaded"] == pushed["blobs"]
    assert main(["--root", str(tmp_path / "cli2"), "add", pushed["reference"], "--json"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["manifest_sha256"] == FIXTURE_DIGEST and added["complete"]
    assert added["sources"]["registry"]["blobs"] == added["blobs_fetched"]

    status, _ = call(daemon, "POST", "/v2/repository/models/fromreg/load",
                     json={"parameters": {"source": registry.ref("models/fx:v1")}})
    assert status == 200
    _, index = call(daemon, "POST", "/v2/repository/index", json={})
    assert [r["name"] for r in index if r["name"] == "fromreg"] == ["fromreg"]
    status, said = call(daemon, "POST", "/v2/repository/models/bad/load",
                        json={"parameters": {"source": registry.ref("models/none:v1")}})
    assert status == 404 and "no such manifest" in json.dumps(said)


def test_a_chunk_cut_off_is_resumed_from_where_the_registry_stands(tmp_path: Path, registry: Registry,
                                                                    make_carton) -> None:
    from kit.tokenproxy import TokenProxy

    with TokenProxy(registry.authority, tokens=False, break_patches=2) as proxy, Store(tmp_path / "s") as s:
        s.add(make_carton(FILES), name="m")
        r = push(s, "m", f"oci://{proxy.authority}/models/m:v1", config())
        assert proxy.broken == 2 and r.uploaded == 5
        with Store(tmp_path / "a") as a:
            pull(a, registry.ref("models/m:v1"), config())
            assert a.blobs.path(sha(BIG)).read_bytes() == BIG and a.verify().ok


def test_a_blob_that_cannot_be_sent_fails_the_push_and_puts_no_manifest(tmp_path: Path, registry: Registry,
                                                                       make_carton) -> None:
    """Every chunk of the big blob is cut off: the push fails naming the
    upload, the other blobs' uploads are stopped, and the tag names nothing."""
    import urllib.error
    import urllib.request

    from kit.tokenproxy import TokenProxy

    with TokenProxy(registry.authority, tokens=False, break_patches=1000) as proxy, Store(tmp_path / "s") as s:
        s.add(make_carton(FILES), name="m")
        with pytest.raises(FetchError, match="blobs/uploads"):
            push(s, "m", f"oci://{proxy.authority}/models/m:v1", config())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://{registry.authority}/v2/models/m/manifests/v1", timeout=10)
    assert e.value.code == 404


# -- TLS -----------------------------------------------------------------------------------


def test_https_registry_is_verified_with_the_configured_ca(tmp_path: Path, make_carton, monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    cert, key = make_cert(tmp_path / "tls")
    with Registry(tmp_path / "registry", tls=(cert, key)) as registry, Store(tmp_path / "s") as s:
        digest = s.add(make_carton(FILES), name="m").digest
        with pytest.raises(FetchError, match="https: .*certificate"):
            push(s, "m", registry.ref("models/m:v1"), config())
        assert push(s, "m", registry.ref("models/m:v1"), config(ca_file=cert)).uploaded == 5
        with Store(tmp_path / "a") as a:
            assert pull(a, registry.ref("models/m:v1"), config(ca_file=cert)).digest == digest


def test_credentials_from_a_credential_helper(tmp_path: Path, locked: Registry, make_carton, monkeypatch) -> None:
    helpers = tmp_path / "bin"
    helpers.mkdir()
    helper = helpers / "docker-credential-fake"
    helper.write_text(f'#!/bin/sh\nread server\necho "$server" > {tmp_path}/asked\n'
                      f'echo \'{{"ServerURL": "x", "Username": "{USER}", "Secret": "{PASSWORD}"}}\'\n')
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{helpers}:{__import__('os').environ['PATH']}")
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "config.json").write_text(json.dumps({"credHelpers": {locked.authority: "fake"}}))
    with Store(tmp_path / "s") as s:
        s.add(make_carton(FILES), name="m")
        assert push(s, "m", locked.ref("models/m:v1"), config()).uploaded == 5
    assert (tmp_path / "asked").read_text().strip() == locked.authority


def test_concurrent_challenges_ask_for_one_token(registry: Registry) -> None:
    import aiohttp
    from kit.tokenproxy import TokenProxy

    from cartonstore.oci.auth import RegistryAuth

    with TokenProxy(registry.authority) as proxy:
        url = f"http://{proxy.authority}/v2/models/m/manifests/v1"
        challenge = f'Bearer realm="http://{proxy.authority}/token",service="test-registry"'

        async def run() -> set[str]:
            auth = RegistryAuth([])
            async with aiohttp.ClientSession() as session:
                return set(await asyncio.gather(*(auth.answer(session, url, [challenge]) for _ in range(8))))

        assert len(asyncio.run(run())) == 1 and len(proxy.token_requests) == 1
