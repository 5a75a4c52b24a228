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


# -- the model formats other tools push (model_formats.py) ------------------------------------


def _model(layers: list[dict], config_type: str = "application/vnd.oci.empty.v1+json", **top) -> dict:
    return {"schemaVersion": 2, "config": {"mediaType": config_type, "digest": D, "size": 2}, "layers": layers, **top}


def _layer(media: str, annotations: dict | None = None, digest: str = D) -> dict:
    return {"mediaType": media, "digest": digest, "size": 5, **({"annotations": annotations} if annotations else {})}


E = "sha256:" + "cd" * 32
MP_RAW = "application/vnd.cncf.model.weight.v1.raw"


@pytest.mark.parametrize(("doc", "fmt", "paths", "tars"), [
    (_model([_layer(MP_RAW, {"org.cncf.model.filepath": "w.safetensors"}),
             _layer("application/vnd.cncf.model.doc.v1.tar+zstd", digest=E)],
            artifactType="application/vnd.cncf.model.manifest.v1+json"), "modelpack", ["w.safetensors"], ["zstd"]),
    (_model([_layer("application/vnd.cnai.model.weight.v1.raw", {"org.cnai.model.filepath": "a/b.bin"})],
            "application/vnd.cnai.model.config.v1+json"), "modelpack", ["a/b.bin"], []),
    (_model([_layer("application/vnd.docker.ai.gguf.v3"), _layer("application/vnd.docker.ai.gguf.v3", digest=E),
             _layer("application/vnd.docker.ai.license", digest="sha256:" + "ef" * 32)],
            "application/vnd.docker.ai.model.config.v0.1+json"),
     "docker-model", ["model-00001-of-00002.gguf", "model-00002-of-00002.gguf", "LICENSE"], []),
    (_model([_layer("application/vnd.kitops.modelkit.model.v1.tar+gzip"),
             _layer("application/vnd.kitops.modelkit.code.v1.tar", digest=E)],
            "application/vnd.kitops.modelkit.config.v1+json"), "kitops", [], ["gzip", ""]),
    (_model([_layer("application/vnd.oci.image.layer.v1.tar", {"org.opencontainers.image.title": "f.bin"}),
             _layer("application/x-dir", {"org.opencontainers.image.title": "d", "io.deis.oras.content.unpack": "true"},
                    digest=E)], artifactType="application/vnd.unknown.artifact.v1"), "oras", ["f.bin"], ["sniff"]),
    (_model([_layer("application/vnd.ollama.image.model"), _layer("application/vnd.ollama.image.license", digest=E),
             _layer("application/vnd.ollama.image.license", digest="sha256:" + "ef" * 32)],
            "application/vnd.docker.container.image.v1+json"), "ollama", ["model.gguf", "LICENSE", "LICENSE-2"], []),
])
def test_model_formats_recognised(doc: dict, fmt: str, paths: list[str], tars: list[str]) -> None:
    from cartonstore.oci.model_formats import model_artifact

    artifact = model_artifact(doc, "here")
    assert artifact is not None and artifact.format == fmt
    assert [layer.path for layer in artifact.raw] == paths
    assert [layer.compression for layer in artifact.tars] == tars
    assert (artifact.config is not None) == (fmt in ("modelpack", "docker-model"))


@pytest.mark.parametrize(("doc", "error", "why"), [
    (_model([_layer("application/vnd.cncf.model.weight.v2.raw")], "application/vnd.cncf.model.config.v1+json"),
     InvalidInput, "not a ModelPack v1 layer"),
    (_model([_layer(MP_RAW)], "application/vnd.cncf.model.config.v1+json"), InvalidInput,
     "names no file: no org.cncf.model.filepath"),
    (_model([_layer(MP_RAW, {"org.cncf.model.filepath": "/etc/x"})], "application/vnd.cncf.model.config.v1+json"),
     InvalidCarton, "is absolute"),
    (_model([_layer("application/vnd.docker.ai.gguf.v3")], "application/vnd.docker.ai.model.config.v0.9+json"),
     InvalidInput, "v0.9.* is not one read here"),
    (_model([_layer("application/vnd.docker.ai.weird")], "application/vnd.docker.ai.model.config.v0.1+json"),
     InvalidInput, "not a Docker model-spec layer"),
    (_model([_layer("application/vnd.ollama.image.model"), _layer("application/vnd.ollama.image.odd", digest=E)]),
     InvalidInput, "not an Ollama layer"),
    (_model([_layer("application/vnd.oci.image.layer.v1.tar")], "application/vnd.oci.image.config.v1+json"),
     InvalidInput, "container image"),
    (_model([_layer(MP_RAW, {"org.cncf.model.filepath": "a"}), _layer(MP_RAW, {"org.cncf.model.filepath": "a"},
                                                                      digest=E)],
            "application/vnd.cncf.model.config.v1+json"), InvalidCarton, "layers 0 and 1 both have this path"),
])
def test_model_formats_refused(doc: dict, error: type, why: str) -> None:
    from cartonstore.oci.model_formats import model_artifact

    with pytest.raises(error, match=why):
        model_artifact(doc, "here")


def test_a_carton_is_left_to_the_carton_reader_unless_served_as_text() -> None:
    from cartonstore.oci.model_formats import model_artifact

    carton = _model([], artifactType=ARTIFACT_TYPE)
    assert model_artifact(carton, "here") is None
    with pytest.raises(InvalidInput, match="served the manifest as text/plain"):
        model_artifact(carton, "here", served="text/plain")


def _filed(path: str, digest: str = D, media: str = MP_RAW) -> dict:
    return _layer(media, {"org.cncf.model.filepath": path}, digest)


MP_CONFIG = "application/vnd.cncf.model.config.v1+json"
F = "sha256:" + "ef" * 32


def test_a_modelpack_artifact_with_a_carton_on_top_is_read_as_that_carton() -> None:
    """carton.toml at the top: a carton push --format modelpack wrote; the
    layers at their filepaths. Anywhere else, or another format: files."""
    from cartonstore.oci.model_formats import model_artifact, pushed_carton_layers

    def layers_of(doc: dict) -> list[Layer] | None:
        artifact = model_artifact(doc, "here")
        assert artifact is not None
        return pushed_carton_layers(artifact, "here")

    carton = _model([_filed("carton.toml"), _filed("MANIFEST", E), _filed("model/m.onnx", F)], MP_CONFIG)
    assert layers_of(carton) == [Layer("carton.toml", D[7:], 5, MP_RAW), Layer("MANIFEST", E[7:], 5, MP_RAW),
                                 Layer("model/m.onnx", F[7:], 5, MP_RAW)]
    assert layers_of(_model([_filed("sub/carton.toml"), _filed("MANIFEST", E)], MP_CONFIG)) is None
    docker = _model([_layer("application/vnd.docker.ai.safetensors", {"org.cncf.model.filepath": "carton.toml"})],
                    "application/vnd.docker.ai.model.config.v0.2+json")
    assert layers_of(docker) is None


@pytest.mark.parametrize(("layers", "why"), [
    ([_filed("carton.toml"), _filed("model/m.onnx", E)], r"MANIFEST: missing: every carton must have one \(here"),
    ([_filed("carton.toml"), _filed("MANIFEST", E), _layer("application/vnd.cncf.model.weight.v1.tar", digest=F)],
     r"carton.toml: here: .* layer sha256:(ef)+ \(application/vnd\.cncf\.model\.weight\.v1\.tar\) is a tar"),
])
def test_a_modelpack_artifact_with_a_carton_on_top_and_no_manifest_or_a_tar_is_refused(layers: list[dict],
                                                                                       why: str) -> None:
    from cartonstore.oci.model_formats import model_artifact, pushed_carton_layers

    artifact = model_artifact(_model(layers, MP_CONFIG), "here")
    assert artifact is not None
    with pytest.raises(InvalidCarton, match=why):
        pushed_carton_layers(artifact, "here")


def test_model_config_format() -> None:
    from cartonstore.oci.model_formats import weights_format

    assert weights_format(b'{"config": {"format": "GGUF"}, "descriptor": {"description": "d"}}', "x") == ("gguf", "d")
    assert weights_format(b'{"config": {"format": "no way"}}', "x") == (None, None)
    with pytest.raises(InvalidInput, match="not JSON"):
        weights_format(b"{", "x")
