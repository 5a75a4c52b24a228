"""Registry mirrors ([registries.mirrors."host"] endpoints, as containerd's
hosts.toml), against two real distribution registries: a pull by digest
is served by the mirror even with the registry down; a tag is resolved at
the registry and its blobs come from the mirror; a mirror that lacks the
carton, or cannot be reached, is passed over for the next and then the
registry; a mirror serving other bytes is not believed; a failing mirror is
asked once per pull; a mirror's bytes count as "mirror"; an evicted blob
comes back from the mirrors of the registry it was pulled from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import sha, snapshot
from kit.ocikit import FILES, config, materialize, pull, push
from kit.registrykit import Registry, free_port, needs_registry

from cartonstore.store import Store
from cartonstore.store.gc.plan import GcPolicy

pytestmark = needs_registry


@pytest.fixture
def two(tmp_path: Path, monkeypatch) -> Iterator[tuple[Registry, Registry]]:
    """(upstream, mirror): the same carton pushed to both as models/m:v1;
    the pushed manifest's digest."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    with Registry(tmp_path / "upstream") as upstream, Registry(tmp_path / "mirror") as mirror:
        yield upstream, mirror


def _pushed(tmp_path: Path, make_carton, *registries: Registry) -> tuple[str, str]:
    with Store(tmp_path / "source") as source:
        digest = source.add(make_carton(FILES), name="m").digest
        references = [push(source, "m", r.ref("models/m:v1"), config()).reference for r in registries]
    return digest, references[0].split("@")[1]


def _mirrors(upstream: Registry, *endpoints: str) -> object:
    return config(mirrors={upstream.authority: endpoints})


def test_a_pull_by_digest_comes_from_the_mirror_with_the_registry_down(tmp_path: Path, two, make_carton) -> None:
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
                                                                           make_carton) -> None:
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


def test_mirrors_that_lack_it_or_are_down_are_passed_over(tmp_path: Path, two, make_carton) -> None:
    upstream, empty = two   # the second registry has nothing pushed: a mirror that lacks the carton
    digest, manifest = _pushed(tmp_path, make_carton, upstream)
    dead = f"http://127.0.0.1:{free_port()}"
    with Store(tmp_path / "node") as node:
        r = pull(node, f"{upstream.ref('models/m')}@{manifest}",
                 _mirrors(upstream, dead, f"http://{empty.authority}"), name="m")
        assert r.digest == digest and r.complete
        assert {p: (materialize(node, "m") / p).read_bytes() for p in FILES} == FILES


def test_a_mirror_serving_other_bytes_is_not_believed(tmp_path: Path, two, make_carton) -> None:
    """A mirror (a real HTTP server, lying on purpose) answers every manifest
    and blob with bytes of its own. By digest, the manifest it serves hashes
    otherwise than the digest asked: it is passed over for the whole pull,
    and the registry serves. By tag (resolved at the registry), the first
    blobs it serves fail their hash (or size), and it is asked for no other."""
    import http.server
    import threading

    asked = []

    class Liar(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = b'{"schemaVersion": 2, "layers": []}'
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    liar = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Liar)
    threading.Thread(target=liar.serve_forever, daemon=True).start()
    upstream, _ = two
    digest, manifest = _pushed(tmp_path, make_carton, upstream)
    mirrors = _mirrors(upstream, f"http://127.0.0.1:{liar.server_address[1]}")
    try:
        with Store(tmp_path / "node") as node:
            r = pull(node, f"{upstream.ref('models/m')}@{manifest}", mirrors, name="m")
            assert r.digest == digest
            assert {p: (materialize(node, "m") / p).read_bytes() for p in FILES} == FILES   # verified by hash
        assert asked == [f"/v2/models/m/manifests/{manifest}?ns={upstream.authority}"]
        asked.clear()
        with Store(tmp_path / "by-tag") as node:
            r = pull(node, upstream.ref("models/m:v1"), mirrors, name="m")
            assert r.digest == digest and r.complete and r.sources["mirror"]["blobs"] == 0
            assert {p: (materialize(node, "m") / p).read_bytes() for p in FILES} == FILES
    finally:
        liar.shutdown()
        liar.server_close()
    # the small files are read at once, so each of those may have been asked; after they failed, nothing was
    assert asked and all("/blobs/sha256:" in path for path in asked)
    assert not any(sha(FILES["model/weights.bin"]) in path for path in asked) and len(asked) < r.blobs_fetched

class _Failing:
    """A mirror (a real HTTP server) that answers every request with
    ``status``, and counts what it was asked."""

    def __init__(self, status: int) -> None:
        import http.server
        import threading

        asked = self.asked = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                asked.append(self.path)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> _Failing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_failing_mirror_is_asked_once_per_pull_one_that_lacks_a_blob_each_time(tmp_path: Path, two,
                                                                                  make_carton) -> None:
    """A mirror that errs (HTTP 500 here; unreachable alike) is passed over
    for the rest of the pull after its first failure, so a pull of many
    blobs pays for a dead mirror once; one that only lacks things (404) is
    asked for each."""
    upstream, _ = two
    digest, manifest = _pushed(tmp_path, make_carton, upstream)
    with _Failing(500) as broken, _Failing(404) as lacking, Store(tmp_path / "node") as node:
        r = pull(node, f"{upstream.ref('models/m')}@{manifest}", _mirrors(upstream, broken.url, lacking.url),
                 name="m")
        assert r.digest == digest and r.complete
        assert broken.asked == [f"/v2/models/m/manifests/{manifest}?ns={upstream.authority}"]
        blobs = [path for path in lacking.asked if "/blobs/" in path]
        assert len(blobs) == r.blobs_fetched >= 3 and len(set(blobs)) == len(blobs)
        assert r.sources["registry"]["blobs"] == r.blobs_fetched and r.sources["mirror"]["blobs"] == 0


def test_bytes_from_a_mirror_are_counted_as_the_mirrors(tmp_path: Path, two, make_carton) -> None:
    upstream, mirror = two
    _, manifest = _pushed(tmp_path, make_carton, upstream, mirror)
    with Store(tmp_path / "node") as node:
        r = pull(node, f"{upstream.ref('models/m')}@{manifest}", _mirrors(upstream, f"http://{mirror.authority}"),
                 name="m")
        assert r.sources["mirror"]["blobs"] == r.blobs_fetched >= 3
        assert r.sources["registry"] == {"bytes": 0, "blobs": 0}
        assert r.sources["mirror"]["bytes"] >= len(FILES["model/weights.bin"])
        figures = {f.kind: f for f in node.source_bytes()}   # the store's, as `ls --sources` shows them
        assert figures["mirror"].fetched_blobs == r.blobs_fetched and figures["oci"].fetched_blobs == 0


def test_an_evicted_blob_comes_back_from_the_registrys_mirror(tmp_path: Path, two, make_carton) -> None:
    """A blob pulled from the registry, evicted, is fetched again from its
    recorded registry URL's mirrors first: with the registry down, the
    mirror brings it back; without mirrors configured, nothing can."""
    upstream, mirror = two
    digest, _ = _pushed(tmp_path, make_carton, upstream, mirror)
    with Store(tmp_path / "node") as node:
        pull(node, upstream.ref("models/m:v1"), config(), name="m")
        evicted = node.collect(GcPolicy(max_size=1, grace=0.0)).evicted_blobs
        assert evicted and node.missing_blobs(digest)
        upstream.stop()
        with pytest.raises(Exception, match="could not fetch blob"):
            materialize(node, "m", config())
        model = materialize(node, "m", _mirrors(upstream, f"http://{mirror.authority}"))
        assert {p: (model / p).read_bytes() for p in FILES} == FILES and node.verify().ok
        assert {f.kind: f.fetched_blobs for f in node.source_bytes()}["mirror"] == evicted   # fetched again


def test_blobs_a_mirror_lacks_fail_naming_a_registry_that_is_not_one(tmp_path: Path, two, make_carton) -> None:
    """The mirror has the manifest but lacks two blobs, and what stands at
    the registry's address is no registry (a real server answering 404):
    the first missing blob falls back to the registry, and the pull fails
    naming why (once: the other blobs stop), leaving the store as it was."""
    _, mirror = two
    with _Failing(404) as nowhere, Store(tmp_path / "source") as source:
        source.add(make_carton(FILES), name="m")
        authority = nowhere.url.removeprefix("http://")
        reference = push(source, "m", mirror.ref("models/m:v1"), config()).reference.split("@")[1]
        blobs = mirror.workdir / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"
        for data in (FILES["model/weights.bin"], FILES["model/vocab.txt"]):
            (blobs / sha(data)[:2] / sha(data) / "data").unlink()
        with Store(tmp_path / "node") as node:
            before = snapshot(node.root)
            with pytest.raises(Exception, match="not an OCI registry"):
                pull(node, f"oci://{authority}/models/m@{reference}",
                     config(mirrors={authority: (f"http://{mirror.authority}",)}), name="m")
            assert snapshot(node.root) == before and not node.blobs.has(sha(FILES["model/weights.bin"]))
        assert nowhere.asked.count("/v2/") == 1


def test_a_mirrors_blobs_are_reached_as_the_registrys_not_through_fetch_proxy(tmp_path: Path, two,
                                                                                make_carton) -> None:
    """A registry's mirror is registry traffic: its blobs go as its manifests
    do (registries.proxy, here none), not through fetch.proxy (here a dead
    port), though they count as "mirror"."""
    from kit.fetchkit import fast_config

    from cartonstore.fetch.http.config import RegistryConfig

    upstream, mirror = two
    digest, manifest = _pushed(tmp_path, make_carton, upstream, mirror)
    upstream.stop()
    cfg = fast_config(proxy="http://127.0.0.1:9", stall_timeout=10.0, registries=RegistryConfig(
        chunk_size=1 << 20, mirrors={upstream.authority: (f"http://{mirror.authority}",)}))
    with Store(tmp_path / "node") as node:
        r = pull(node, f"{upstream.ref('models/m')}@{manifest}", cfg, name="m")
        assert r.digest == digest and r.complete and r.sources["mirror"]["blobs"] == r.blobs_fetched >= 3


def _one_at_a_time(upstream: Registry, *endpoints: str, **registries: object) -> object:
    """Mirrors config whose blobs are fetched one after another (so how
    often a mirror is asked does not depend on timing)."""
    from kit.fetchkit import fast_config

    from cartonstore.fetch.http.config import RegistryConfig

    return fast_config(max_concurrency=1, stall_timeout=10.0, registries=RegistryConfig(
        chunk_size=1 << 20, mirrors={upstream.authority: endpoints}, **registries))  # type: ignore[arg-type]  # RegistryConfig's keys


def test_a_mirror_that_errs_on_a_blob_is_asked_for_no_other(tmp_path: Path, two, make_carton) -> None:
    """By tag (the manifest from the registry), a mirror answering 500 is
    asked for one blob in the pull; the next mirror serves them all."""
    upstream, mirror = two
    digest, _ = _pushed(tmp_path, make_carton, upstream, mirror)
    with _Failing(500) as broken, Store(tmp_path / "node") as node:
        r = pull(node, upstream.ref("models/m:v1"),
                 _one_at_a_time(upstream, broken.url, f"http://{mirror.authority}"), name="m")
        assert r.digest == digest and r.complete and r.sources["mirror"]["blobs"] == r.blobs_fetched >= 3
        assert len(broken.asked) == 1 and "/blobs/sha256:" in broken.asked[0]


def test_how_long_a_failing_mirror_is_passed_over_is_registries_mirror_down_for(tmp_path: Path, two,
                                                                                make_carton) -> None:
    """registries.mirror_down_for = 0: a mirror answering 500 is asked
    again for each blob of the pull (the next mirror still serves them)."""
    upstream, mirror = two
    digest, _ = _pushed(tmp_path, make_carton, upstream, mirror)
    with _Failing(500) as broken, Store(tmp_path / "node") as node:
        r = pull(node, upstream.ref("models/m:v1"),
                 _one_at_a_time(upstream, broken.url, f"http://{mirror.authority}", mirror_down_for=0.0), name="m")
        assert r.digest == digest and r.complete and r.sources["mirror"]["blobs"] == r.blobs_fetched >= 3
        assert len(broken.asked) == r.blobs_fetched and all("/blobs/sha256:" in path for path in broken.asked)


def test_evicted_blobs_fetched_again_pass_a_failing_mirror_over(tmp_path: Path, two, make_carton) -> None:
    """Fetching evicted blobs again asks a mirror that answers 500 once, not
    once per blob, and the next mirror brings them back."""
    upstream, mirror = two
    digest, _ = _pushed(tmp_path, make_carton, upstream, mirror)
    with _Failing(500) as broken, Store(tmp_path / "node") as node:
        pull(node, upstream.ref("models/m:v1"), config(), name="m")
        assert node.collect(GcPolicy(max_size=1, grace=0.0)).evicted_blobs
        evicted = len(node.missing_blobs(digest))
        assert evicted >= 2
        upstream.stop()
        model = materialize(node, "m", _one_at_a_time(upstream, broken.url, f"http://{mirror.authority}"))
        assert {p: (model / p).read_bytes() for p in FILES} == FILES
        assert len(broken.asked) == 1


def test_a_failing_mirror_is_passed_over_by_the_whole_node_not_each_pull(tmp_path: Path, two,
                                                                           make_carton) -> None:
    """One puller (a daemon's): a mirror that answered 500 in a pull is not
    asked again when the same node fetches evicted blobs back right after."""
    import asyncio

    from cartonstore.config.pulling import standard_puller

    upstream, mirror = two
    digest, _ = _pushed(tmp_path, make_carton, upstream, mirror)

    async def pull_evict_and_fetch_again(node: Store) -> Path:
        async with standard_puller(node, _one_at_a_time(upstream, broken.url, f"http://{mirror.authority}")) as p:
            await p.add(upstream.ref("models/m:v1"), name="m")
            assert len(broken.asked) == 1
            assert (await asyncio.to_thread(node.collect, GcPolicy(max_size=1, grace=0.0))).evicted_blobs
            return await p.materialize("m")

    with _Failing(500) as broken, Store(tmp_path / "node") as node:
        model = asyncio.run(pull_evict_and_fetch_again(node))
        assert {p: (model / p).read_bytes() for p in FILES} == FILES and node.missing_blobs(digest) == []
        assert len(broken.asked) == 1
