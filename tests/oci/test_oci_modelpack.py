"""Stored cartons pushed as CNCF ModelPack artifacts (push --format
modelpack) to a real distribution registry, read back with plain HTTP as
modctl or KitOps would, and checked field by field against the ModelPack
spec v1: media types, artifactType, the config and its descriptor, raw
layers whose digests are the files' (and the diffIds), the filepath and
file metadata annotations. Added back: a carton of model files as the
same files, a runnable carton as itself (same digest, it runs)."""

from __future__ import annotations

import json
import struct
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, carton_entries, manifest_for, sha, snapshot, write_zip
from kit.ocikit import config, materialize, pull, push
from kit.registrykit import Registry, needs_registry, shared_registry

from cartonstore.carton.from_files import ListedFile, files_carton
from cartonstore.errors import InvalidCarton, InvalidInput, ManifestMismatch
from cartonstore.oci.modelpack import layer_kind
from cartonstore.store import Store

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MODEL_MANIFEST = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
CODE = "application/vnd.cncf.model.code.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
FILEPATH = "org.cncf.model.filepath"
FILE_METADATA = "org.cncf.model.file.metadata+json"

ONNX_TOML = b'''spec_version = 1
model_name = "tiny-onnx"
short_description = "a tiny graph"
license = "MIT"
repository = "https://example.com/tiny"

[runner]
runner_name = "onnx"
required_framework_version = ">=1.0.0"
'''
RUNNABLE = {"carton.toml": ONNX_TOML, "model/model.onnx": b"graph" * 2000, "model/labels.json": b'["a", "b"]',
            "model/README.md": b"# tiny\n", "model/run.py": b"print('hi')\n"}
RUNNABLE_KINDS = {"carton.toml": WEIGHT_CONFIG, "MANIFEST": WEIGHT_CONFIG, "model/model.onnx": WEIGHT,
                  "model/labels.json": WEIGHT_CONFIG, "model/README.md": DOC, "model/run.py": CODE}


def safetensors(fill: int, count: int) -> bytes:
    """A safetensors file of one U8 tensor of count bytes, each fill."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [count], "data_offsets": [0, count]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + bytes([fill]) * count


# A Hugging Face repository as its tools keep it, and the kind modctl gives each file.
REPOSITORY = {
    "model-00001-of-00002.safetensors": (safetensors(1, 30000), WEIGHT),
    "model-00002-of-00002.safetensors": (safetensors(2, 20000), WEIGHT),
    "config.json": (b'{"model_type": "tiny"}', WEIGHT_CONFIG),
    "tokenizer.model": (b"\x00spm", WEIGHT_CONFIG),
    "README.md": (b"# tiny\n", DOC),
    "LICENSE": (b"MIT\n", DOC),
    "modeling_tiny.py": (b"class Tiny: pass\n", CODE),
    "notes.unknown": (b"?", CODE),   # no pattern names it, and it is small
}


@pytest.mark.parametrize(("path", "size", "kind"), [
    ("Model.SafeTensors", 1, "weight"),            # names are matched lowercased
    ("docs/config.json", 1, "weight.config"),      # by the base name only
    ("config.json/run.py", 1, "code"),
    ("vocab.txt", 1, "weight.config"),             # config patterns before doc's *.txt
    ("pyproject.toml", 1, "weight.config"),        # and before code's pyproject.toml
    ("requirements-dev.txt", 1, "code"),           # code before doc
    ("model.gguf.part2", 1, "weight"),
    ("LICENSE.md", 1, "doc"),
    ("MANIFEST", 1, "weight.config"),              # the carton's list of its files
    ("blob", 128_000_000, "code"),                 # unnamed: weights above 128 MB only
    ("blob", 128_000_001, "weight"),
])
def test_the_kind_of_a_file_is_modctls(path: str, size: int, kind: str) -> None:
    assert layer_kind(path, size) == kind


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with shared_registry(tmp_path_factory) as r:
        yield r


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, str, str]]:
    """A store with a runnable (onnx) carton and a carton of model files
    made by files_carton: (store, runnable digest, files digest)."""
    directory = tmp_path_factory.mktemp("cartons")
    store = Store(directory / "store")
    runnable = store.add(write_zip(directory / "runnable.carton", carton_entries(RUNNABLE)), name="runnable").digest
    made = files_carton("tiny", {path: ListedFile(sha(data), len(data)) for path, (data, _) in REPOSITORY.items()},
                        origin="a test")
    entries = [*((path, made.small["carton.toml"] if path == "carton.toml" else REPOSITORY[path[6:]][0])
                 for path in made.files), ("MANIFEST", made.small["MANIFEST"])]
    files = store.add(write_zip(directory / "files.carton", entries), name="tiny").digest
    assert files == sha(made.small["MANIFEST"])
    yield store, runnable, files
    store.close()


def read_back(registry: Registry, repo: str, tag: str) -> tuple[dict, dict]:
    """The manifest and its config, as any registry client reads them,
    checked against what the spec requires of every ModelPack artifact."""
    manifest = json.loads(registry.manifest(repo, tag))
    assert manifest["schemaVersion"] == 2 and manifest["mediaType"] == OCI_MANIFEST
    assert manifest["artifactType"] == MODEL_MANIFEST
    assert manifest["config"]["mediaType"] == MODEL_CONFIG
    raw = registry.blob(repo, manifest["config"]["digest"].removeprefix("sha256:"))
    assert manifest["config"] == {"mediaType": MODEL_CONFIG, "digest": f"sha256:{sha(raw)}", "size": len(raw)}
    model = json.loads(raw)
    assert set(model) == {"descriptor", "config", "modelfs"}
    # Raw layers: each layer is its uncompressed content, so its DiffID is its digest.
    assert model["modelfs"] == {"type": "layers", "diffIds": [layer["digest"] for layer in manifest["layers"]]}
    for layer in manifest["layers"]:
        annotations = layer["annotations"]
        assert set(annotations) == {FILEPATH, FILE_METADATA}
        path = annotations[FILEPATH]
        assert json.loads(annotations[FILE_METADATA]) == {
            "name": path.rsplit("/", 1)[-1], "mode": 0o644, "uid": 0, "gid": 0, "size": layer["size"],
            "mtime": "0001-01-01T00:00:00Z", "typeflag": 0}
        assert registry.has_blob(repo, layer["digest"].removeprefix("sha256:"))
    return manifest, model


def by_path(manifest: dict) -> dict[str, dict]:
    return {layer["annotations"][FILEPATH]: layer for layer in manifest["layers"]}


@needs_registry
def test_a_runnable_carton_keeps_its_own_paths(registry: Registry, source) -> None:
    store, digest, _ = source
    result = push(store, "runnable", registry.ref("mp/runnable:v1"), config(), fmt="modelpack")
    manifest, model = read_back(registry, "mp/runnable", "v1")
    assert result.format == "modelpack" and result.carton == digest
    assert result.reference.endswith("@sha256:" + sha(registry.manifest("mp/runnable", "v1")))
    assert result.uploaded == result.blobs == len(RUNNABLE) + 2   # the files, MANIFEST, the config
    layers = by_path(manifest)
    manifest_bytes = store.blobs.path(digest).read_bytes()
    carton_order = [entry.path for entry in store.index.entries(digest) if entry.path != "carton.toml"]
    assert list(layers) == ["carton.toml", "MANIFEST", *carton_order]
    assert {path: layer["mediaType"] for path, layer in layers.items()} == RUNNABLE_KINDS
    contents = {**RUNNABLE, "MANIFEST": manifest_bytes}
    assert all(layer["digest"] == f"sha256:{sha(contents[path])}" and layer["size"] == len(contents[path])
               for path, layer in layers.items())
    assert model["config"] == {"format": "onnx"}
    assert model["descriptor"] == {"name": "tiny-onnx", "description": "a tiny graph", "licenses": ["MIT"],
                                   "sourceURL": "https://example.com/tiny"}


@needs_registry
def test_a_carton_of_model_files_is_pushed_as_the_repository_it_holds(registry: Registry, source) -> None:
    """model/ stripped; the carton.toml and MANIFEST cartonstore generated
    stay behind; each layer's digest is the store's blob key."""
    store, _, digest = source
    push(store, "tiny", registry.ref("mp/tiny:v1"), config(), fmt="modelpack")
    manifest, model = read_back(registry, "mp/tiny", "v1")
    layers = by_path(manifest)
    carton_order = [entry.path[6:] for entry in store.index.entries(digest) if entry.path != "carton.toml"]
    assert list(layers) == carton_order and set(layers) == set(REPOSITORY)
    assert {path: layer["mediaType"] for path, layer in layers.items()} == {
        path: kind for path, (_, kind) in REPOSITORY.items()}
    for path, layer in layers.items():
        assert layer["digest"] == f"sha256:{sha(REPOSITORY[path][0])}"
        assert store.blobs.has(layer["digest"].removeprefix("sha256:"))
    assert model["config"] == {"format": "safetensors"} and model["descriptor"] == {"name": "tiny"}


@needs_registry
def test_a_second_push_uploads_no_blob_and_a_carton_push_shares_every_file(registry: Registry, source) -> None:
    store, _, _ = source
    as_carton = push(store, "tiny", registry.ref("mp/shared:carton"), config())
    first = push(store, "tiny", registry.ref("mp/shared:v1"), config(), fmt="modelpack")
    assert first.uploaded == 1 and first.bytes_uploaded < 1000   # only the config: the files were there
    again = push(store, "tiny", registry.ref("mp/shared:v2"), config(), fmt="modelpack")
    assert again.uploaded == 0 and again.bytes_uploaded == 0 and again.present == again.blobs
    # The same carton is the same artifact, pushed twice.
    assert again.reference.split("@")[1] == first.reference.split("@")[1] != as_carton.reference.split("@")[1]


@needs_registry
def test_a_carton_with_no_model_files_is_refused(registry: Registry, tmp_path: Path) -> None:
    toml = files_carton("empty", {"x.safetensors": ListedFile(sha(b""), 0)}, origin="a test").small["carton.toml"]
    with Store(tmp_path / "store") as store:
        store.add(write_zip(tmp_path / "empty.carton", carton_entries({"carton.toml": toml})), name="empty")
        with pytest.raises(InvalidInput, match="carton 'empty' holds no model files"):
            push(store, "empty", registry.ref("mp/empty:v1"), config(), fmt="modelpack")
    with pytest.raises(urllib.error.HTTPError):
        registry.manifest("mp/empty", "v1")


@needs_registry
def test_cli_push_format(tmp_path: Path, registry: Registry, capsys) -> None:
    from cartonstore.cli.commands import main
    from cartonstore.cli.parser import PUSH_FORMATS
    from cartonstore.oci.push import PUSH_FORMATS as PUSHED

    assert PUSH_FORMATS == PUSHED
    root = str(tmp_path / "cli")
    assert main(["--root", root, "add", str(FIXTURE_CARTON), "--name", "fx"]) == 0
    capsys.readouterr()
    target = registry.ref("mp/fx:v1")
    assert main(["--root", root, "push", "fx", target, "--format", "modelpack", "--json"]) == 0
    pushed = json.loads(capsys.readouterr().out)
    assert pushed["format"] == "modelpack" and pushed["uploaded"] == pushed["blobs"]
    assert read_back(registry, "mp/fx", "v1")[0]["artifactType"] == MODEL_MANIFEST

    with pytest.raises(SystemExit) as exit_status:
        main(["--root", root, "push", "fx", registry.ref("mp/fx:v2"), "--format", "gguf"])
    assert exit_status.value.code == 2 and "invalid choice: 'gguf'" in capsys.readouterr().err
    with Store(tmp_path / "cli") as store, pytest.raises(InvalidInput, match="push format 'gguf' is not one of"):
        push(store, "fx", registry.ref("mp/fx:v2"), config(), fmt="gguf")
    with pytest.raises(urllib.error.HTTPError):
        registry.manifest("mp/fx", "v2")


# -- added back from the registry ------------------------------------------------


def model_files(store: Store, digest: str) -> dict[str, bytes]:
    model = materialize(store, digest, config())
    return {str(p.relative_to(model)): p.read_bytes() for p in model.rglob("*")
            if p.is_file() and p.parts[len(model.parts)] == "model"}


@needs_registry
def test_a_carton_of_model_files_comes_back_with_the_same_files(registry: Registry, source, tmp_path: Path) -> None:
    store, _, digest = source
    push(store, "tiny", registry.ref("back/tiny:v1"), config(), fmt="modelpack")
    with Store(tmp_path / "back") as back:
        again = pull(back, registry.ref("back/tiny:v1"), config(), name="tiny").digest
        assert model_files(back, again) == model_files(store, digest) == {
            f"model/{path}": data for path, (data, _) in REPOSITORY.items()}
        assert back.index.carton(again).runner_name == store.index.carton(digest).runner_name == "safetensors"


@pytest.fixture(scope="module")
def affine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runnable onnx carton's directory: y = 2x + 1 on float32 [N, 4]."""
    from kit.runnerkit import onnx_model_dir

    return onnx_model_dir(tmp_path_factory.mktemp("affine"), name="affine", ids=False)


@needs_registry
def test_a_runnable_carton_comes_back_as_itself_and_runs(registry: Registry, source, affine: Path, short_tmp: Path,
                                                         capsys) -> None:
    from kit.clikit import run

    store, _, _ = source
    digest = store.add(affine, name="affine").digest
    push(store, "affine", registry.ref("back/affine:v1"), config(), fmt="modelpack")
    root = short_tmp / "root"   # short: the runner's socket lives under it
    with Store(root) as back:
        result = pull(back, registry.ref("back/affine:v1"), config(), name="affine")
        assert result.digest == digest and result.complete
        assert back.index.carton(digest).runner_name == "onnx"
        assert model_files(back, digest) == model_files(store, digest)
    code, out, err = run(capsys, "infer", "affine", "--input", "x=[[1, 2, 3, 4]]", "--root", str(root),
                         "--socket", str(short_tmp / "no-daemon.sock"))
    assert code == 0, err
    assert "[[3. 5. 7. 9.]]" in out


@needs_registry
@pytest.mark.parametrize(("extra", "refused"), [
    ({}, r"MANIFEST: missing: every carton must have one \(.*carton\.toml at its top"),
    ({"MANIFEST": manifest_for({"carton.toml": ONNX_TOML, "model/model.onnx": b"another graph"})},
     r"model/model\.onnx: does not match MANIFEST: its layer is sha256:\w+, MANIFEST says"),
])
def test_a_modelpack_artifact_with_a_carton_toml_on_top_is_checked_as_a_carton(registry: Registry, tmp_path: Path,
                                                                                extra: dict, refused: str) -> None:
    """No MANIFEST, or one that disagrees with the layers: refused by name,
    as a carton would be, and not taken as files."""
    from kit import modelkit_oci as mk

    artifact = mk.modelpack({"carton.toml": ONNX_TOML, **extra, "model/model.onnx": b"graph" * 2000}, fmt="onnx")
    ref = mk.push(registry, "back/hostile", f"v{len(extra)}", artifact)
    with Store(tmp_path / "s") as s:
        before = snapshot(s.root)
        with pytest.raises((InvalidCarton, ManifestMismatch), match=refused):
            pull(s, ref, config())
        assert snapshot(s.root) == before
