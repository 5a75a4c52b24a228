"""One 64 MiB safetensors file, stored once whichever way it comes: pushed
to a real registry as a carton, as a ModelPack artifact and as a Docker
model-spec artifact (built as those tools push them, kit/modelkit_oci.py),
and served by the stand-in for the Hugging Face Hub (kit/hub_server.py: the
Hub is not reachable here), then added all four ways to one store. The
blobs/ folder grows by the file once (its blocks on disk, ``du``), the file
is one blob under four names, and the store's figures say which kind of
source found it already stored."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MINIMAL_TOML, sha
from kit import modelkit_oci as mk
from kit.clikit import run
from kit.hub_server import HubServer
from kit.modelfiles import safetensors_file
from kit.ocikit import config, push
from kit.registrykit import Registry, needs_registry, shared_registry

from cartonstore.store import Store

SIZE = 64 << 20
SLACK = 1 << 20   # the generated carton.toml and MANIFEST blobs, a few blocks each


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return safetensors_file(tmp_path_factory.mktemp("weights") / "model.safetensors", {"w": ("U8", (SIZE,))},
                            random=True)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with shared_registry(tmp_path_factory) as r:
        yield r


@pytest.fixture(scope="module")
def hub(weights: Path) -> Iterator[HubServer]:
    with HubServer() as server:
        server.add_repo("acme/big", {"model.safetensors": weights})
        yield server


def blocks_used(directory: Path) -> int:
    """What ``du`` counts: the bytes of the blocks every file holds."""
    return sum(os.lstat(Path(top) / name).st_blocks * 512 for top, _dirs, files in os.walk(directory)
               for name in files)


@needs_registry
def test_one_file_added_four_ways_is_stored_once(registry: Registry, hub: HubServer, weights: Path, tmp_path: Path,
                                                  capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    data = weights.read_bytes()
    carton = tmp_path / "carton"
    (carton / "model").mkdir(parents=True)
    (carton / "carton.toml").write_bytes(MINIMAL_TOML)
    os.link(weights, carton / "model" / "model.safetensors")
    with Store(tmp_path / "pusher") as pusher:
        pusher.add(carton, name="big")
        as_carton = push(pusher, "big", registry.ref("big/carton:v1"), config()).reference
    refs = {"as-carton": as_carton,
            "as-modelpack": mk.push(registry, "big/modelpack", "v1", mk.modelpack({"model.safetensors": data})),
            "as-docker": mk.push(registry, "big/docker", "v1", mk.docker_model([("safetensors", data, None)],
                                                                                fmt="safetensors")),
            "from-hub": "hf://acme/big"}
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.delenv("HF_TOKEN", raising=False)

    root = tmp_path / "root"
    with Store(root) as store:
        blobs_dir = store.layout.blobs_dir
    grown = []
    for name, ref in refs.items():
        before = blocks_used(blobs_dir)
        code, out, err = run(capsys, "add", ref, "--name", name, "--root", str(root), "--json")
        assert code == 0, err
        assert json.loads(out)["complete"]
        grown.append(blocks_used(blobs_dir) - before)
    assert SIZE <= grown[0] < SIZE + SLACK and all(g < SLACK for g in grown[1:]), grown

    digest = sha(weights.read_bytes())
    with Store(root) as store:
        assert [d for d in store.blobs.iter_digests() if store.blobs.size(d) >= SIZE] == [digest]
        cartons = {name: store.resolve(name) for name in refs}
        assert len(set(cartons.values())) == 4
        assert all(digest in {e.digest for e in store.index.entries(c)} for c in cartons.values())
    code, out, err = run(capsys, "ls", "--sources", "--json", "--root", str(root))
    assert code == 0, err
    figures = json.loads(out)
    size = weights.stat().st_size
    assert SIZE < figures["oci"]["fetched_bytes"] < size + SLACK
    assert (figures["oci"]["reused_bytes"], figures["oci"]["reused_blobs"]) == (2 * size, 2)
    assert figures["hf"] == {"fetched_bytes": 0, "fetched_blobs": 0, "reused_bytes": size, "reused_blobs": 1}
