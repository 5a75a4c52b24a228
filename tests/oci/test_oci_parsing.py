"""The pure parts of OCI support: references, challenges, artifact manifests."""

from __future__ import annotations

import json

import pytest

from cartonstore.errors import InvalidCarton, InvalidInput
from cartonstore.oci.artifact import ARTIFACT_TYPE, Layer, build_manifest, layers_for, parse_manifest
from cartonstore.oci.challenge import parse_challenges
from cartonstore.oci.reference import OciReference, parse_reference

D = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("text", "expected"), [
    ("oci://reg.example.com/models/resnet:v1", OciReference("reg.example.com", "models/resnet", "v1")),
    ("oci://reg.example.com/resnet", OciReference("reg.example.com", "resnet", "latest")),
    ("oci://127.0.0.1:5000/a/b/c@" + D, OciReference("127.0.0.1:5000", "a/b/c", None, D)),
    ("oci://[::1]:5000/a:t@" + D, OciReference("[::1]:5000", "a", "t", D)),
    ("oci://localhost:5000/my_repo.x--y__z:Tag_1.2-3", OciReference("localhost:5000", "my_repo.x--y__z", "Tag_1.2-3")),
])
def test_references(text: str, expected: OciReference) -> None:
    assert parse_reference(text) == expected
    assert parse_reference(str(expected)) == expected


@pytest.mark.parametrize(("text", "why"), [
    ("https://h/r", "not an OCI reference"), ("oci://h", "no repository"), ("oci://h/", "no repository"),
    ("oci://h/R", "repository"), ("oci://h/a//b", "repository"), ("oci://h/a_", "repository"),
    ("oci://h/r:.t", "tag"), ("oci://h/r:" + "t" * 129, "tag"), ("oci://h/r@sha512:00", "digest"),
    ("oci://h/r@sha256:" + "AB" * 32, "digest"), ("oci://h:99999/r", "port"), ("oci://h h/r", "host"),
    ("oci://h/" + "a" * 256, "longer than 255"),
])
def test_bad_references(text: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        parse_reference(text)


def test_challenges() -> None:
    [c] = parse_challenges('Bearer realm="https://auth.example/token",service="registry.example",'
                           'scope="repository:a/b:pull,push"')
    assert c.scheme == "bearer" and c.realm == "https://auth.example/token"
    assert c.params == {"realm": "https://auth.example/token", "service": "registry.example",
                        "scope": "repository:a/b:pull,push"}
    basic, bearer = parse_challenges('Basic realm="a \\"quoted\\" realm", Bearer realm=tok,service=s')
    assert basic.scheme == "basic" and basic.realm == 'a "quoted" realm' and bearer.params == {"realm": "tok",
                                                                                               "service": "s"}
    assert parse_challenges("") == []


def test_manifests_round_trip() -> None:
    layers = layers_for([("model/w.bin", "11" * 32, 5), ("carton.toml", "22" * 32, 3), ("MANIFEST", "33" * 32, 9)])
    assert [layer.path for layer in layers] == ["carton.toml", "MANIFEST", "model/w.bin"]
    raw = build_manifest(layers)
    assert json.loads(raw)["artifactType"] == ARTIFACT_TYPE
    assert parse_manifest(raw, "here") == layers


def doc(**changes) -> bytes:
    base = json.loads(build_manifest([Layer("carton.toml", "22" * 32, 3)]))
    base.update(changes)
    return json.dumps(base).encode()


@pytest.mark.parametrize(("raw", "error", "why"), [
    (b"not json", InvalidInput, "not JSON"),
    (b"[]", InvalidInput, "not a JSON object"),
    (doc(schemaVersion=1), InvalidInput, "schemaVersion 2"),
    (doc(artifactType="application/x"), InvalidInput, "artifact of type 'application/x'"),
    (doc(layers=[{"mediaType": "m", "digest": "sha256:00", "size": 1}]), InvalidInput, "digest"),
    (doc(layers=[{"mediaType": "m", "digest": D, "size": -1}]), InvalidInput, "size"),
    (doc(layers=[{"mediaType": "m", "digest": D, "size": True}]), InvalidInput, "size"),
    (doc(layers=[{"digest": D, "size": 1, "annotations": {"org.opencontainers.image.title": "a"}}]),
     InvalidInput, "no mediaType"),
    (doc(layers=[{"mediaType": "m", "digest": D, "size": 1}]), InvalidInput, "no org.opencontainers.image.title"),
    (doc(layers=[{"mediaType": "m", "digest": D, "size": 1, "annotations": {
        "org.opencontainers.image.title": "model", "io.deis.oras.content.unpack": "true"}}]),
     InvalidInput, "directory packed"),
    (doc(layers=[{"mediaType": "m", "digest": D, "size": 1, "annotations": {
        "org.opencontainers.image.title": "model/../../x"}}]), InvalidCarton, "'..' component"),
    (doc(layers=[{"mediaType": "m", "digest": D, "size": 1, "annotations": {"org.opencontainers.image.title": "a"}}] * 2),
     InvalidCarton, "both have this path"),
    (b" " * (4 << 20) + b"{}", InvalidInput, "more than"),
])
def test_bad_manifests(raw: bytes, error: type, why: str) -> None:
    with pytest.raises(error, match=why):
        parse_manifest(raw, "oci://h/r:t")


# -- credentials files -------------------------------------------------------------------------


def test_credentials_keys_entries_and_order(tmp_path) -> None:
    import base64

    from cartonstore.oci.credentials import Credentials, find_credentials

    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps({"auths": {"https://Reg.Example:5000/v1/": {"username": "u", "password": "p"}}}))
    second.write_text(json.dumps({"auths": {
        "reg.example:5000": {"auth": base64.b64encode(b"other:x").decode()},
        "tok.example": {"identitytoken": "refresh"},
        "plain.example": {"auth": base64.b64encode(b"a:b:c").decode()}}}))
    assert find_credentials("reg.example:5000", [first, second]) == Credentials("u", "p")
    assert find_credentials("tok.example", [tmp_path / "absent.json", second]) == Credentials(identity_token="refresh")
    assert find_credentials("plain.example", [second]) == Credentials("a", "b:c")
    assert find_credentials("nowhere.example", [first, second]) is None
    assert "p" not in repr(Credentials("u", "p"))


@pytest.mark.parametrize(("doc", "why"), [
    ("not json", "not JSON"),
    ("[]", "not a JSON object"),
    ('{"auths": {"h": {"auth": "%%%"}}}', "not base64"),
    ('{"auths": {"h": {"auth": "bm9jb2xvbg=="}}}', "no ':'"),
    ('{"credHelpers": {"h": "surely-not-installed"}}', "docker-credential-surely-not-installed .* is not installed"),
    ('{"credsStore": "surely-not-installed"}', "is not installed"),
])
def test_bad_credentials_files(tmp_path, doc: str, why: str) -> None:
    from cartonstore.oci.credentials import find_credentials

    path = tmp_path / "config.json"
    path.write_text(doc)
    with pytest.raises(InvalidInput, match=why):
        find_credentials("h", [path])


def test_a_failing_credential_helper_is_named(tmp_path, monkeypatch) -> None:
    from cartonstore.oci.credentials import find_credentials

    helper = tmp_path / "docker-credential-broken"
    helper.write_text("#!/bin/sh\necho 'keychain locked' >&2\nexit 1\n")
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    path = tmp_path / "config.json"
    path.write_text('{"credsStore": "broken"}')
    with pytest.raises(InvalidInput, match="docker-credential-broken get failed: keychain locked"):
        find_credentials("h", [path])


@pytest.mark.parametrize(("body", "said"), [
    (b'{"errors": [{"code": "DENIED", "message": "no push"}]}', "DENIED: no push"),
    (b'{"errors": 5}', '{"errors": 5}'),                 # not the errors shape: the body as it is
    (b'{"errors": ["x"]}', '{"errors": ["x"]}'),
    (b'[1, 2]', "[1, 2]"),
    (b"<html>bad gateway</html>", "<html>bad gateway</html>"),
    (b"", "no detail"),
])
def test_what_a_registry_said_is_read_whatever_its_body(body: bytes, said: str) -> None:
    from cartonstore.oci.registry import Answer, said_by_registry

    assert said_by_registry(Answer(500, {}, body, "http://r/v2/")) == said
