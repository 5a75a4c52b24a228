"""cartonstore pack: directory -> spec-conformant carton, with and without LINKS."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
import tomli

from cartonstore.errors import InvalidCarton, InvalidInput
from cartonstore.pack import pack_directory
from cartonstore.store import Store
from cartonstore.zipfmt import ZipLimits, ZipReader
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, MINIMAL_TOML, manifest_for, sha


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    (d / "model").mkdir(parents=True)
    (d / "carton.toml").write_bytes(MINIMAL_TOML)
    (d / "model" / "small.txt").write_bytes(b"small")
    (d / "model" / "big.bin").write_bytes(os.urandom(300_000))
    return d


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


@pytest.mark.parametrize("compression,method", [("zstd", 93), ("deflate", 8), ("stored", 0)])
def test_pack_writes_each_compression(model_dir: Path, tmp_path: Path, compression: str, method: int) -> None:
    out = tmp_path / f"m-{compression}.carton"
    w = pack_directory(model_dir, out, compression=compression)
    assert w.digest == sha(manifest_for(_files(model_dir)))
    with ZipReader(out, ZipLimits()) as z:
        methods = {e.name: e.method for e in z.entries}
    assert methods["model/big.bin"] == method
    assert methods["MANIFEST"] == 0
    assert list(methods)[0] == "carton.toml"
    if compression != "zstd":  # Python's zipfile reads what we write
        with zipfile.ZipFile(out) as zf:
            assert zf.read("model/big.bin") == (model_dir / "model" / "big.bin").read_bytes()
            assert zf.testzip() is None


def test_pack_then_add_yields_the_same_hash(model_dir: Path, tmp_path: Path) -> None:
    w = pack_directory(model_dir, tmp_path / "m.carton")
    with Store(tmp_path / "root") as s:
        assert s.add(tmp_path / "m.carton").digest == w.digest


def test_pack_of_the_fixture_reproduces_its_manifest(tmp_path: Path) -> None:
    with Store(tmp_path / "root") as s:
        model = s.materialize(s.add(FIXTURE_CARTON).digest)
    w = pack_directory(model, tmp_path / "re.carton", compression="deflate")
    assert w.digest == FIXTURE_DIGEST


def test_pack_with_links_leaves_big_files_out(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "linked.carton"
    w = pack_directory(model_dir, out, link_prefix="https://models.example/blobs/", link_min_size=100_000)
    assert (w.files_inline, w.files_linked) == (2, 1)
    big_sha = sha((model_dir / "model" / "big.bin").read_bytes())
    with ZipReader(out, ZipLimits()) as z:
        names = [e.name for e in z.entries]
        links = tomli.loads(z.open(next(e for e in z.entries if e.name == "LINKS")).read().decode())
    assert "model/big.bin" not in names
    assert links == {"version": 1, "urls": {big_sha: [f"https://models.example/blobs/{big_sha}"]}}
    with Store(tmp_path / "root") as s:
        r = s.add(out)
        assert r.digest == w.digest and not r.complete
        assert s.info(r.digest).missing_blobs == [big_sha]
        assert s.index.links_for(big_sha) == [f"https://models.example/blobs/{big_sha}"]
        s.add(model_dir)  # the directory holds the linked file: now complete
        assert (s.materialize(r.digest) / "model" / "big.bin").stat().st_size == 300_000


def test_pack_ignores_a_stale_manifest_in_the_directory(model_dir: Path, tmp_path: Path) -> None:
    (model_dir / "MANIFEST").write_text("garbage\n")
    w = pack_directory(model_dir, tmp_path / "m.carton")
    assert w.digest == sha(manifest_for({k: v for k, v in _files(model_dir).items() if k != "MANIFEST"}))


@pytest.mark.parametrize("mutate,pattern", [
    (lambda d: (d / "carton.toml").unlink(), "carton.toml.*missing"),
    (lambda d: (d / "carton.toml").write_text("spec_version = 1\n"), "runner"),
    (lambda d: os.symlink("/nonexistent/target", d / "model" / "dangling"), "broken symlink"),
    (lambda d: (d / "model" / "x.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0[1,2]"), "x.safetensors"),
])
def test_pack_rejects_bad_directories(model_dir: Path, tmp_path: Path, mutate, pattern: str) -> None:
    mutate(model_dir)
    out = tmp_path / "bad.carton"
    with pytest.raises(InvalidCarton, match=pattern):
        pack_directory(model_dir, out)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bad.carton")]


def test_pack_link_options_are_checked(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="http"):
        pack_directory(model_dir, tmp_path / "m.carton", link_prefix="ftp://x", link_min_size=1)
    with pytest.raises(InvalidInput, match="link-prefix"):
        pack_directory(model_dir, tmp_path / "m.carton", link_min_size=1)
