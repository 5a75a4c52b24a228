"""Models other tools push to OCI registries, added as cartons of their
files: ModelPack (cncf, cnai), Docker model-spec, KitOps, ORAS and Ollama
artifacts, built with each spec's media types and annotations
(tests/kit/modelkit_oci.py) and pushed to a real registry; tar layers
unpacked as they stream, hostile ones refused by name with the store as
it was; one blob for weights pulled in several formats; lazy adds."""

from __future__ import annotations

import json
import struct
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MINIMAL_TOML, sha, snapshot
from kit import modelkit_oci as mk
from kit.fetchkit import fast_config, tmp_files
from kit.ocikit import config, materialize, pull
from kit.origin import Fault
from kit.registrykit import Registry, needs_registry, shared_registry

from cartonstore.errors import CartonStoreError, InvalidCarton, InvalidInput
from cartonstore.store import Store
from cartonstore.zipfmt import ZipLimits


def safetensors(n: int, fill: int = 7) -> bytes:
    header = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes([fill]) * n


WEIGHTS = safetensors(1 << 20)
GGUF_1, GGUF_2 = b"GGUF" + b"\x01" * 5000, b"GGUF" + b"\x02" * 3000
TOKENIZER = b'{"vocab": ["a", "b"]}'


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with shared_registry(tmp_path_factory) as r:
        yield r


def added(store: Store, ref: str, name: str, **kw) -> tuple[dict[str, bytes], str]:
    """Add ref, materialize it; its model/ files and runner_name."""
    result = pull(store, ref, config(), name=name, **kw)
    model = materialize(store, name, config())
    files = {str(p.relative_to(model / "model")): p.read_bytes() for p in (model / "model").rglob("*") if p.is_file()}
    row = store.index.carton(result.digest)
    assert row is not None and store.verify().ok
    return files, row.runner_name or ""


CASES = {
    "modelpack-cncf": (lambda: mk.modelpack({"model.safetensors": WEIGHTS, "config.json": b"{}"}),
                       {"model.safetensors": WEIGHTS, "config.json": b"{}"}, "safetensors"),
    "modelpack-cnai-tars": (lambda: mk.modelpack(
        {"model.safetensors": WEIGHTS}, [("tar+gzip", mk.tar_of([("tokenizer/tok.json", TOKENIZER)], "gzip")),
                                         ("tar+zstd", mk.tar_of([("./README.md", b"# m\n")], "zstd")),
                                         ("tar", mk.tar_of([("generation_config.json", b"{}")]))],
        prefix="cnai", fmt="pytorch"),
        {"model.safetensors": WEIGHTS, "tokenizer/tok.json": TOKENIZER, "README.md": b"# m\n",
         "generation_config.json": b"{}"}, "pytorch"),
    "docker-v0.1": (lambda: mk.docker_model([("gguf.v3", GGUF_1, None), ("gguf.v3", GGUF_2, None),
                                             ("license", b"MIT\n", None), ("mmproj", b"GGUFproj", None),
                                             ("chat.template.jinja", b"{{ m }}", None)]),
                    {"model-00001-of-00002.gguf": GGUF_1, "model-00002-of-00002.gguf": GGUF_2, "LICENSE": b"MIT\n",
                     "mmproj.gguf": b"GGUFproj", "chat_template.jinja": b"{{ m }}"}, "gguf"),
    "docker-v0.2": (lambda: mk.docker_model([("safetensors", WEIGHTS, "weights/model.safetensors"),
                                             ("dir.tar", mk.tar_of([("tokenizer/tok.json", TOKENIZER)]), "tokenizer")],
                                            version="v0.2", fmt="safetensors"),
                    {"weights/model.safetensors": WEIGHTS, "tokenizer/tok.json": TOKENIZER}, "safetensors"),
    "kitops": (lambda: mk.kitops([("model.v1.tar+gzip", mk.tar_of([("model/m.gguf", GGUF_1)], "gzip")),
                                  ("code.v1.tar", mk.tar_of([("src/run.py", b"print(1)\n")]))]),
               {"model/m.gguf": GGUF_1, "src/run.py": b"print(1)\n"}, "gguf"),
    "oras": (lambda: mk.oras({"weights.safetensors": WEIGHTS},
                             {"tok": mk.tar_of([("tok/a.json", TOKENIZER), ("tok/b/c.txt", b"c")], "gzip")}),
             {"weights.safetensors": WEIGHTS, "tok/a.json": TOKENIZER, "tok/b/c.txt": b"c"}, "safetensors"),
    "ollama": (lambda: mk.ollama([("model", GGUF_1), ("template", b"{{ .Prompt }}"), ("params", b'{"stop":[]}'),
                                  ("license", b"L1"), ("license", b"L2"), ("system", b"be brief")]),
               {"model.gguf": GGUF_1, "template": b"{{ .Prompt }}", "params.json": b'{"stop":[]}', "LICENSE": b"L1",
                "LICENSE-2": b"L2", "system.txt": b"be brief"}, "gguf"),
}


@needs_registry
@pytest.mark.parametrize("case", list(CASES))
def test_each_format_is_added_byte_identical(tmp_path: Path, registry: Registry, case: str) -> None:
    build, expected, runner = CASES[case]
    ref = mk.push(registry, case.replace(".", "-"), "v1", build())
    with Store(tmp_path / "s") as s:
        files, runner_name = added(s, ref, "m")
        assert files == expected and runner_name == runner
        assert not tmp_files(s)


@needs_registry
def test_the_same_weights_as_carton_modelpack_and_docker_are_one_blob(tmp_path: Path, registry: Registry,
                                                                       make_carton) -> None:
    from kit.ocikit import push as push_carton

    with Store(tmp_path / "src") as src:
        src.add(make_carton({"carton.toml": MINIMAL_TOML, "model/model.safetensors": WEIGHTS}), name="c")
        as_carton = push_carton(src, "c", registry.ref("same/carton:v1"), config()).reference
    as_modelpack = mk.push(registry, "same/modelpack", "v1", mk.modelpack({"model.safetensors": WEIGHTS}))
    as_docker = mk.push(registry, "same/docker", "v1", mk.docker_model([("safetensors", WEIGHTS, None)],
                                                                         fmt="safetensors"))
    with Store(tmp_path / "s") as s:
        fetched = [pull(s, ref, config(), name=name).sources["registry"]["bytes"]
                   for name, ref in [("c", as_carton), ("mp", as_modelpack), ("dk", as_docker)]]
        assert fetched[0] >= len(WEIGHTS) and all(b < len(WEIGHTS) for b in fetched[1:])   # fetched once
        weights = [p for p in s.blobs.iter_digests() if s.blobs.size(p) == len(WEIGHTS)]
        assert weights == [sha(WEIGHTS)]
        assert all(s.index.carton_for_name(name) for name in ("c", "mp", "dk"))
        for name in ("mp", "dk"):
            assert (materialize(s, name) / "model/model.safetensors").read_bytes() == WEIGHTS


def hostile(kind: str) -> list:
    return {
        "dotdot": [("../x", b"x")],
        "absolute": [("/etc/x", b"x")],
        "symlink": [mk.special("link", tarfile.SYMTYPE, "/etc/passwd")],
        "hardlink": [("a", b"a"), mk.special("b", tarfile.LNKTYPE, "a")],
        "device": [mk.special("dev", tarfile.CHRTYPE)],
        "fifo": [mk.special("pipe", tarfile.FIFOTYPE)],
    }[kind]


WHY = {"dotdot": r"member '\.\./x': a path that leaves the model folder",
       "absolute": r"member '/etc/x': an absolute path",
       "symlink": r"member 'link': a symbolic link \(to '/etc/passwd'\)",
       "hardlink": r"member 'b': a hard link \(to 'a'\)",
       "device": r"member 'dev': a device", "fifo": r"member 'pipe': a fifo"}


@needs_registry
@pytest.mark.parametrize("kind", list(WHY))
def test_a_hostile_tar_member_is_refused_by_name(tmp_path: Path, registry: Registry, kind: str) -> None:
    layer = mk.tar_of([("ok.txt", b"fine"), *hostile(kind)], "gzip")
    ref = mk.push(registry, f"hostile/{kind}", "v1", mk.kitops([("model.v1.tar+gzip", layer)]))
    with Store(tmp_path / "s") as s:
        before = snapshot(s.root)
        with pytest.raises(InvalidInput, match=rf"layer sha256:{sha(layer)} {WHY[kind]}"):
            pull(s, ref, config())
        assert snapshot(s.root) == before and not tmp_files(s)


@needs_registry
def test_a_filepath_annotation_with_dotdot_is_refused(tmp_path: Path, registry: Registry) -> None:
    ref = mk.push(registry, "hostile/annotation", "v1", mk.modelpack({"../../x": b"x"}))
    with Store(tmp_path / "s") as s:
        before = snapshot(s.root)
        with pytest.raises(InvalidCarton, match=r"\.\./\.\./x: .*org\.cncf\.model\.filepath annotation has a '\.\.'"):
            pull(s, ref, config())
        assert snapshot(s.root) == before and not list(s.blobs.iter_digests())


def test_a_raw_layer_whose_bytes_do_not_match_its_digest(store: Store, origin) -> None:
    ref = mk.serve(origin, mk.modelpack({"model.safetensors": WEIGHTS}),
                   faults={sha(WEIGHTS): Fault(wrong_bytes=True)})
    before = snapshot(store.root)
    with pytest.raises(CartonStoreError, match=f"(?s)could not fetch blob {sha(WEIGHTS)}.*bytes hash to sha256"):
        pull(store, ref, fast_config(retries=1))
    assert snapshot(store.root) == before and not tmp_files(store)


def test_a_tar_layer_whose_bytes_do_not_match_its_digest(store: Store, origin) -> None:
    layer, other = mk.tar_of([("a.txt", b"aaaa")]), mk.tar_of([("a.txt", b"bbbb")])
    assert len(layer) == len(other)
    ref = mk.serve(origin, mk.kitops([("model.v1.tar", layer)]))
    origin.put(f"/v2/r/blobs/sha256:{sha(layer)}", other)   # a valid tar, not the layer's
    before = snapshot(store.root)
    with pytest.raises(CartonStoreError, match=rf"layer sha256:{sha(layer)}: its bytes hash to sha256:{sha(other)}"):
        pull(store, ref, fast_config(retries=1))
    assert snapshot(store.root) == before and not tmp_files(store)


def refused_unchanged(store: Store, origin, layer: bytes, match: str) -> None:
    ref = mk.serve(origin, mk.kitops([("model.v1.tar+gzip", layer)]))
    before = snapshot(store.root)
    with pytest.raises(InvalidInput, match=match):
        pull(store, ref, fast_config(retries=1))
    assert snapshot(store.root) == before and not tmp_files(store)


EXTENDED = {
    "pax": (lambda: mk.header_claiming(tarfile.XHDTYPE, 1 << 30),
            rf"has an extended header \(tar type b'x'\) of {1 << 30} bytes; .* at most {1 << 20}"),
    "gnu-longname": (lambda: mk.header_claiming(tarfile.GNUTYPE_LONGNAME, 1 << 30),
                     rf"has an extended header \(tar type b'L'\) of {1 << 30} bytes; .* at most {1 << 20}"),
    "pax-global": (lambda: mk.header_claiming(tarfile.XGLTYPE, 1 << 30),
                   rf"has global pax headers of more than {1 << 20} bytes"),
    "pax-chain": (lambda: mk.headers_ahead(tarfile.XHDTYPE, 17, ("a.txt", b"a")),
                  r"has more than 16 extended headers ahead of one member"),
}


@pytest.mark.parametrize("kind", list(EXTENDED))
def test_an_extended_header_past_the_bound_is_refused_before_it_is_read(store: Store, origin, kind: str) -> None:
    """tarfile reads a pax or GNU long-name header whole, at the size it
    declares (a few KiB of gzip may declare 1 GiB), and a chain of them by
    recursion."""
    build, why = EXTENDED[kind]
    layer = build()
    assert len(layer) < 4096
    refused_unchanged(store, origin, layer, rf"layer sha256:{sha(layer)} {why}")


def test_a_layer_that_decompresses_past_the_stores_ratio_is_refused(tmp_path: Path, origin) -> None:
    layer = mk.tar_of([("zeros.bin", bytes(4 << 20))], "gzip")
    with Store(tmp_path / "s", zip_limits=ZipLimits(max_ratio=10, ratio_floor=1 << 20)) as store:
        refused_unchanged(store, origin, layer, rf"layer sha256:{sha(layer)} decompresses to more than {1 << 20} "
                                                rf"bytes \(\[limits\] zip_max_ratio: 10 times its {len(layer)} "
                                                rf"bytes.*refused as a decompression bomb")


def test_a_layer_of_more_members_than_the_store_takes_is_refused(tmp_path: Path, origin) -> None:
    layer = mk.tar_of([(f"f{i}.txt", b"x") for i in range(4)], "gzip")
    with Store(tmp_path / "s", zip_limits=ZipLimits(max_entries=3)) as store:
        refused_unchanged(store, origin, layer,
                          rf"layer sha256:{sha(layer)} has more than 3 members \(\[limits\] zip_max_entries\)")


def test_a_member_twice_in_one_layer_is_refused_by_name(store: Store, origin) -> None:
    layer = mk.tar_of([("a.txt", b"one"), ("b.txt", b"b"), ("./a.txt", b"two")], "gzip")
    refused_unchanged(store, origin, layer, rf"member 'a\.txt' appears twice in layer sha256:{sha(layer)}")


def test_ollama_manifests_served_as_text_plain(store: Store, origin) -> None:
    """Ollama's registry serves manifests as text/plain: read when the body
    is an Ollama manifest, refused otherwise."""
    ref = mk.serve(origin, mk.ollama([("model", GGUF_1), ("template", b"t")]), content_type="text/plain")
    r = pull(store, ref, fast_config(), name="o")
    assert r.complete and (materialize(store, "o") / "model/model.gguf").read_bytes() == GGUF_1
    origin.put("/v2/r/manifests/t", mk.modelpack({"w.safetensors": WEIGHTS}).manifest, content_type="text/plain")
    before = snapshot(store.root)
    with pytest.raises(InvalidInput, match="served the manifest as text/plain.*not an Ollama manifest"):
        pull(store, ref, fast_config())
    assert snapshot(store.root) == before


@needs_registry
def test_lazy_leaves_raw_layers_for_later_and_refuses_tar_layers(tmp_path: Path, registry: Registry) -> None:
    raw = mk.push(registry, "lazy/raw", "v1", mk.modelpack({"model.safetensors": WEIGHTS}))
    tar = mk.push(registry, "lazy/tar", "v1", mk.kitops([("model.v1.tar", mk.tar_of([("m.gguf", GGUF_1)]))]))
    with Store(tmp_path / "s") as s:
        r = pull(s, raw, config(), name="m", lazy=True)
        assert not r.complete and s.missing_blobs(r.digest) == [sha(WEIGHTS)]
        assert (materialize(s, "m", config()) / "model/model.safetensors").read_bytes() == WEIGHTS
        before = snapshot(s.root)
        with pytest.raises(InvalidInput, match=r"cannot be added lazily: layer sha256:\w+ "
                                               r"\(application/vnd\.kitops\.modelkit\.model\.v1\.tar\) is a tar"):
            pull(s, tar, config(), lazy=True)
        assert snapshot(s.root) == before


@needs_registry
def test_an_onnx_graph_pushed_as_modelpack_comes_with_the_onnx_runners_declaration(tmp_path: Path,
                                                                                    registry: Registry) -> None:
    """A ModelPack of one .onnx graph (config.format onnx) is declared as
    `pack` declares it: inputs, outputs, the graph named where it was put;
    lazily (the graph not here to read) it stays a carton of files."""
    from kit.runnerkit import onnx_model_dir

    from cartonstore.format.carton_toml import parse_carton_toml

    graph = (onnx_model_dir(tmp_path / "src", name="affine", ids=False) / "model" / "model.onnx").read_bytes()
    ref = mk.push(registry, "onnx/affine", "v1", mk.modelpack({"onnx/affine.onnx": graph}, fmt="onnx"))
    with Store(tmp_path / "root") as store:
        model = materialize(store, pull(store, ref, config(), name="affine").digest, config())
        declared = parse_carton_toml((model / "carton.toml").read_bytes())
        assert declared.runner.runner_name == "onnx" and declared.runner.opts == {"model_file": "onnx/affine.onnx"}
        assert [i.name for i in declared.inputs or ()] == ["x"] and declared.outputs
    with Store(tmp_path / "lazy") as store:
        model = materialize(store, pull(store, ref, config(), name="affine", lazy=True).digest, config())
        assert parse_carton_toml((model / "carton.toml").read_bytes()).inputs is None
