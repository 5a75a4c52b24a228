"""What a registry can get wrong, and what a second client makes (issue 12
§1): each bad artifact is a clear error and leaves the store as it was; an
artifact skopeo pushed is added, and what cartonstore pushed is copied by
skopeo. The misbehaving registry is tests/kit/origin.py serving the
distribution API's paths; the well-behaved one is docker-registry."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import MINIMAL_TOML, manifest_for, sha, snapshot
from kit.fetchkit import fast_config
from kit.ocikit import FILES, config, pull, push
from kit.origin import Fault
from kit.registrykit import Registry, needs_registry

from cartonstore.errors import CartonStoreError, FetchError, InvalidCarton, InvalidInput
from cartonstore.fetch.puller import PullResult
from cartonstore.store import Store

WEIGHTS = FILES["model/weights.bin"]
SKOPEO = shutil.which("skopeo")


def descriptor(path: str, data: bytes, *, size: int | None = None, media: str = "application/octet-stream") -> dict:
    return {"mediaType": media, "digest": f"sha256:{sha(data)}", "size": len(data) if size is None else size,
            "annotations": {"org.opencontainers.image.title": path}}


def manifest(layers: list[dict], **top) -> bytes:
    doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
           "artifactType": "application/vnd.carton.v1",
           "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": f"sha256:{sha(b'{}')}", "size": 2},
           "layers": layers, **top}
    return json.dumps(doc).encode()


def fake_registry(origin, files: dict[str, bytes], layers: list[dict] | None = None,
                  faults: dict[str, Fault] | None = None, raw: bytes | None = None) -> str:
    """origin serving a repository "r" with tag "t"; returns the reference."""
    origin.put("/v2/", b"{}")
    for data in files.values():
        origin.put(f"/v2/r/blobs/sha256:{sha(data)}", data, fault=(faults or {}).get(sha(data)))
    origin.put("/v2/r/manifests/t", raw or manifest(layers or [descriptor(p, d) for p, d in files.items()]))
    return f"oci://127.0.0.1:{origin.port}/r:t"


def refused(store: Store, ref: str, error: type, match: str) -> None:
    before = snapshot(store.root)
    with pytest.raises(error, match=match):
        pull(store, ref, fast_config(retries=1))
    assert snapshot(store.root) == before


def test_a_fake_registry_that_behaves_is_read(store: Store, origin) -> None:
    r = pull(store, fake_registry(origin, FILES), fast_config())
    assert r.complete and r.digest == sha(manifest_for(FILES))   # MANIFEST rebuilt from titles and digests


def test_a_blob_whose_bytes_do_not_match_its_digest(store: Store, origin) -> None:
    ref = fake_registry(origin, FILES, faults={sha(WEIGHTS): Fault(wrong_bytes=True)})
    refused(store, ref, CartonStoreError, f"(?s)could not fetch blob {sha(WEIGHTS)}.*bytes hash to sha256")


def test_a_registry_that_lies_about_sizes(store: Store, origin) -> None:
    smaller = [descriptor(p, d, size=len(d) - 10 if p == "model/weights.bin" else None) for p, d in FILES.items()]
    refused(store, fake_registry(origin, FILES, smaller), CartonStoreError, "the manifest says")
    toml_bigger = [descriptor(p, d, size=len(d) + 5 if p == "carton.toml" else None) for p, d in FILES.items()]
    refused(store, fake_registry(origin, FILES, toml_bigger), CartonStoreError, "sent .* bytes, its manifest says")


def test_a_path_escaping_the_carton(store: Store, origin) -> None:
    layers = [descriptor(p, d) for p, d in FILES.items()] + [descriptor("../../etc/evil", b"x")]
    refused(store, fake_registry(origin, {**FILES, "x": b"x"}, layers), InvalidCarton, r"\.\./\.\./etc/evil")
    absolute = [descriptor(p, d) for p, d in FILES.items()] + [descriptor("/etc/evil", b"x")]
    refused(store, fake_registry(origin, {**FILES, "x": b"x"}, absolute), InvalidCarton, "absolute")


def test_another_artifact_type_an_image_and_an_index(store: Store, origin) -> None:
    untitled = [{k: v for k, v in descriptor(p, d).items() if k != "annotations"} for p, d in FILES.items()]
    refused(store, fake_registry(origin, FILES, raw=manifest(untitled, artifactType="application/vnd.other+type")),
            InvalidInput, "artifact of type 'application/vnd.other\\+type' whose layers do not all name a file")
    layers = [descriptor(p, d) for p, d in FILES.items()]
    image = json.loads(manifest(layers))
    del image["artifactType"]
    image["config"]["mediaType"] = "application/vnd.oci.image.config.v1+json"
    refused(store, fake_registry(origin, FILES, raw=json.dumps(image).encode()), InvalidInput, "container image")
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}
    refused(store, fake_registry(origin, FILES, raw=json.dumps(index).encode()), InvalidInput, "image index")


def test_layers_that_disagree_with_manifest_or_lack_a_title(store: Store, origin) -> None:
    listed = manifest_for({**FILES, "model/weights.bin": b"other"})
    files = {**FILES, "MANIFEST": listed}
    refused(store, fake_registry(origin, files), CartonStoreError, "model/weights.bin")
    untitled = [descriptor(p, d) for p, d in FILES.items()]
    del untitled[1]["annotations"]
    refused(store, fake_registry(origin, FILES, untitled), InvalidInput, "no org.opencontainers.image.title")
    no_toml = {p: d for p, d in FILES.items() if p != "carton.toml"}
    refused(store, fake_registry(origin, no_toml), InvalidCarton, "carton.toml")


def test_401_without_a_usable_challenge(store: Store, origin) -> None:
    ref = fake_registry(origin, FILES)
    origin.set_fault("/v2/r/manifests/t", Fault(status_sequence=[401] * 10))
    refused(store, ref, FetchError, "401 Unauthorized without a usable challenge")


def test_bad_references_are_named(store: Store) -> None:
    for text, why in [("oci://127.0.0.1:5000", "no repository"), ("oci://127.0.0.1:5000/UPPER:t", "repository"),
                      ("oci://127.0.0.1:5000/r:-t", "tag"), ("oci://127.0.0.1:5000/r@sha256:abc", "digest"),
                      ("oci://bad host/r", "host")]:
        refused(store, text, InvalidInput, why)


# -- a second client: skopeo ------------------------------------------------------------

needs_skopeo = pytest.mark.skipif(SKOPEO is None, reason="skopeo (Debian package skopeo) is not installed; "
                                                         ".ci/run installs it")


@needs_registry
@needs_skopeo
def test_skopeo_copies_what_cartonstore_pushed(tmp_path: Path, make_carton, monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    with Registry(tmp_path / "registry") as registry, Store(tmp_path / "s") as s:
        s.add(make_carton(FILES), name="m")
        push(s, "m", registry.ref("models/m:v1"), config())
        out = tmp_path / "copied"
        subprocess.run([SKOPEO, "copy", "--src-tls-verify=false", f"docker://{registry.authority}/models/m:v1",
                        f"dir:{out}"], check=True, capture_output=True, timeout=120)
        assert (out / "manifest.json").read_bytes() == registry.manifest("models/m", "v1")
        for data in FILES.values():
            assert (out / sha(data)).read_bytes() == data


@needs_registry
@needs_skopeo
def test_an_artifact_skopeo_pushed_is_added(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    layout = tmp_path / "layout"
    layout.mkdir()
    files = {"carton.toml": MINIMAL_TOML, "model/weights.bin": WEIGHTS, "model/vocab.txt": b"v"}
    for data in [*files.values(), b"{}"]:
        (layout / sha(data)).write_bytes(data)
    (layout / "manifest.json").write_bytes(manifest([descriptor(p, d) for p, d in files.items()]))
    (layout / "version").write_text("Directory Transport Version: 1.1\n")
    with Registry(tmp_path / "registry") as registry, Store(tmp_path / "s") as s:
        subprocess.run([SKOPEO, "copy", "--dest-tls-verify=false", f"dir:{layout}",
                        f"docker://{registry.authority}/by-skopeo/m:v1"], check=True, capture_output=True, timeout=120)
        r = pull(s, registry.ref("by-skopeo/m:v1"), config())
        assert r.complete and r.digest == sha(manifest_for(files)) and s.verify().ok


# -- concurrent callers and adding again ------------------------------------------------------


def test_concurrent_adds_of_one_reference_share_one_fetch(store: Store, origin) -> None:
    import asyncio

    from cartonstore.config.pulling import standard_puller

    ref = fake_registry(origin, FILES)

    async def run() -> list[PullResult]:
        async with standard_puller(store, fast_config()) as p:
            return await asyncio.gather(*(p.add(ref) for _ in range(4)))

    results = asyncio.run(run())
    assert {r.digest for r in results} == {sha(manifest_for(FILES))} and all(r.complete for r in results)
    assert origin.count("/v2/r/manifests/t") == 1
    for data in FILES.values():
        assert origin.count(f"/v2/r/blobs/sha256:{sha(data)}") == 1


def test_adding_again_fetches_no_blob(store: Store, origin) -> None:
    ref = fake_registry(origin, FILES)
    first = pull(store, ref, fast_config())
    origin.reset_counts()
    again = pull(store, ref, fast_config())
    assert again.digest == first.digest and again.blobs_fetched == 0
    assert all(origin.count(f"/v2/r/blobs/sha256:{sha(d)}") == 0 for d in FILES.values())
