"""Registry mirrors ([registries.mirrors."host"] endpoints, as containerd's
hosts.toml), against two real distribution registries: a pull by digest
is served by the mirror even with the registry down; a tag is resolved at
the registry and its blobs come from the mirror; a mirror that lacks the
carton, or cannot be reached, is passed over for the next and then the
registry; a mirror serving other bytes is not believed."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import sha
from kit.fetchkit import materialize, pull
from kit.ocikit import FILES, config, push
from kit.registrykit import Registry, free_port, needs_registry

from cartonstore.store import Store

pytestmark = needs_registry


@pytest.fixture
def two(tmp_path: Path, monkeypatch):  # noqa: ANN001, ANN201
    """(upstream, mirror): the same carton pushed to both as models/m:v1;
    the pushed manifest's digest."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    with Registry(tmp_path / "upstream") as upstream, Registry(tmp_path / "mirror") as mirror:
        yield upstream, mirror


def _pushed(tmp_path: Path, make_carton, *registries: Registry) -> tuple[str, str]:  # noqa: ANN001
    with Store(tmp_path / "source") as source:
        digest = source.add(make_carton(FILES), name="m").digest
        references = [push(source, "m", r.ref("models/m:v1"), config()).reference for r in registries]
    return digest, references[0].split("@")[1]


def _mirrors(upstream: Registry, *endpoints: str) -> object:
    return config(mirrors={upstream.authority: endpoints})


def test_a_pull_by_digest_comes_from_the_mirror_with_the_registry_down(tmp_path: Path, two, make_carton) -> None:  # noqa: ANN001
    upstream, mirror = two
    digest, manifest = _pushed(tmp_path, make_carton, upstream, mirror)
    upstream.stop()
    with Store(tmp_path / "node") as node:
        r = pull(node, f"{upstream.ref('models/m')}@{manifest}", _mirrors(upstream, f"http://{mirror.authority}"),
                 name="m")
        assert r.digest == digest and r.complete
        assert {p: (materialize(node, "m") / p).read_bytes() for p in FILES} == FILES
        # what is recorded to fetch an evicted blob again is the registry's URL, never a mirror's
        weights = sha(FILES["model/weights.bin"])
        assert node.index.links_for(weights) == [f"http://{upstream.authority}/v2/models/m/blobs/sha256:{weights}"]


def test_a_tag_resolves_at_the_registry_and_its_blobs_come_from_the_mirror(tmp_path: Path, two,
                                                                           make_carton) -> None:  # noqa: ANN001
    upstream, mirror = two
    digest, _ = _pushed(tmp_path, make_carton, upstream, mirror)
    weights = sha(FILES["model/weights.bin"])
    # the registry loses the big blob's bytes (its manifest and tag stay): only the mirror has them
    (upstream.workdir / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256" / weights[:2] / weights /
     "data").unlink()
    with Store(tmp_path / "node") as node:
        r = pull(node, upstream.ref("models/m:v1"), _mirrors(upstream, f"http://{mirror.authority}"), name="m")
        assert r.digest == digest and r.complete
        assert (materialize(node, "m") / "model/weights.bin").read_bytes() == FILES["model/weights.bin"]
    with Store(tmp_path / "plain") as plain, pytest.raises(Exception, match=weights):   # without it: no bytes
        pull(plain, upstream.ref("models/m:v1"), config())


def test_mirrors_that_lack_it_or_are_down_are_passed_over(tmp_path: Path, two, make_carton) -> None:  # noqa: ANN001
    upstream, empty = two   # the second registry has nothing pushed: a mirror that lacks the carton
    digest, manifest = _pushed(tmp_path, make_carton, upstream)
    dead = f"http://127.0.0.1:{free_port()}"
    with Store(tmp_path / "node") as node:
        r = pull(node, f"{upstream.ref('models/m')}@{manifest}",
                 _mirrors(upstream, dead, f"http://{empty.authority}"), name="m")
        assert r.digest == digest and r.complete
        assert {p: (materialize(node, "m") / p).read_bytes() for p in FILES} == FILES


def test_a_mirror_serving_other_bytes_is_not_believed(tmp_path: Path, two, make_carton) -> None:  # noqa: ANN001
    """A mirror (a real HTTP server, lying on purpose) answers every manifest
    and blob with bytes of its own: the manifest it serves hashes otherwise
    than the digest asked, so it is passed over, and the registry serves."""
    import http.server
    import threading

    asked = []

    class Liar(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            asked.append(self.path)
            body = b'{"schemaVersion": 2, "layers": []}'
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # noqa: ANN002
            pass

    liar = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Liar)
    threading.Thread(target=liar.serve_forever, daemon=True).start()
    upstream, _ = two
    digest, manifest = _pushed(tmp_path, make_carton, upstream)
    try:
        with Store(tmp_path / "node") as node:
            r = pull(node, f"{upstream.ref('models/m')}@{manifest}",
                     _mirrors(upstream, f"http://127.0.0.1:{liar.server_address[1]}"), name="m")
            assert r.digest == digest
            assert {p: (materialize(node, "m") / p).read_bytes() for p in FILES} == FILES   # verified by hash
    finally:
        liar.shutdown()
        liar.server_close()
    assert f"/v2/models/m/manifests/{manifest}?ns={upstream.authority}" in asked
    assert any("/blobs/sha256:" in path for path in asked)   # its blobs were tried too, and failed their hash
