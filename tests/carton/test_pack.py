"""cartonstore pack: directory -> spec-conformant carton, with and without LINKS."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import BinaryIO

import pytest
import tomli
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, MINIMAL_TOML, manifest_for, sha

from cartonstore.carton.pack import pack_directory
from cartonstore.errors import InvalidCarton, InvalidInput
from cartonstore.store import Store
from cartonstore.zipfmt import ZipLimits, ZipReader


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
    assert next(iter(methods)) == "carton.toml"
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


def _zip_names(path: Path) -> list[str]:
    with ZipReader(path, ZipLimits()) as z:
        return [e.name for e in z.entries]


def test_pack_refuses_top_level_entries_outside_the_format(model_dir: Path, tmp_path: Path, capsys) -> None:
    from cartonstore.cli.commands import main

    (model_dir / "notes.txt").write_text("mine")
    (model_dir / "old.carton").write_bytes(b"PK stale")
    (model_dir / ".git").mkdir()
    (model_dir / ".git" / "config").write_text("[core]\n")
    (model_dir / "misc").mkdir()
    (model_dir / "misc" / "ok.png").write_bytes(b"png")  # inside the format: fine
    (model_dir / "tensor_data.bak").mkdir()
    (model_dir / "tensor_data.bak" / "x").write_bytes(b"x")
    out = tmp_path / "m.carton"
    assert main(["pack", str(model_dir), "-o", str(out)]) == 4
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("cartonstore pack: error: .git/, notes.txt, old.carton, tensor_data.bak/: "
                                   "outside the carton format")
    assert "misc" not in captured.err.split(":")[2]
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".m.carton")]
    for p in ("notes.txt", "old.carton"):
        (model_dir / p).unlink()
    import shutil

    shutil.rmtree(model_dir / ".git")
    shutil.rmtree(model_dir / "tensor_data.bak")
    assert main(["pack", str(model_dir), "-o", str(out)]) == 0
    assert "misc/ok.png" in _zip_names(out)


def test_a_file_named_like_a_folder_is_outside_the_format(model_dir: Path, tmp_path: Path) -> None:
    (model_dir / "misc").write_bytes(b"a file, not the misc folder")
    with pytest.raises(InvalidCarton, match=r"^misc: outside the carton format"):
        pack_directory(model_dir, tmp_path / "m.carton")


def _symlinked_output(src: Path, tmp_path: Path) -> Path:
    (tmp_path / "alias").symlink_to(src, target_is_directory=True)
    return tmp_path / "alias" / "out.carton"


def _output_through_a_file_symlink(src: Path, tmp_path: Path) -> Path:
    (tmp_path / "link.carton").symlink_to(src / "out.carton")
    return tmp_path / "link.carton"


@pytest.mark.parametrize("where", [
    lambda src, tmp: src / "out.carton",                     # inside the directory
    lambda src, tmp: src / "model" / "out.carton",           # at a nested path
    lambda src, tmp: src / "model" / ".." / "out.carton",    # spelled with ..
    _symlinked_output,                                        # through a symlink to the directory
    _output_through_a_file_symlink,                           # -o is a symlink into the directory
], ids=["inside", "nested", "dotdot", "symlinked-dir", "symlink-file"])
def test_pack_never_packs_its_own_output(model_dir: Path, tmp_path: Path, capsys, where) -> None:
    """Packing twice to the same -o gives the same carton: the first run's
    output (and a crashed run's temporary file beside it) is never packed."""
    from cartonstore.cli.commands import main

    expected = sha(manifest_for(_files(model_dir)))
    out = where(model_dir, tmp_path)
    if out.is_symlink():
        (model_dir / "out.carton").write_bytes(b"a previous run's carton")
    for _ in range(2):
        assert main(["pack", str(model_dir), "-o", str(out), "--json"]) == 0
        written = Path(json.loads(capsys.readouterr().out)["path"])
        assert written.resolve() == out.resolve() and written.is_file()
        if out.is_symlink():  # written through the link, as a shell's > would
            assert written == model_dir / "out.carton" and out.resolve() == written
        (out.parent / f".{out.name}.0123abcd.tmp").write_bytes(b"left by a killed pack")
        assert sorted(n for n in _zip_names(out) if n != "MANIFEST") == sorted(_files_without_outputs(model_dir))
        with Store(tmp_path / "root") as s:
            assert s.add(out).digest == expected


def _files_without_outputs(d: Path) -> list[str]:
    return [p for p in _files(d) if not p.endswith((".carton", ".tmp"))]


def test_add_refuses_a_carton_with_entries_outside_the_format(tmp_path: Path, make_carton, capsys) -> None:
    """The spec lists what a carton holds; a zip or directory with more (here
    a stale out.carton listed in its MANIFEST) is refused, store unchanged."""
    from conftest import snapshot

    from cartonstore.cli.commands import main

    root = tmp_path / "root"
    assert main(["add", str(FIXTURE_CARTON), "--root", str(root), "--progress", "none"]) == 0
    capsys.readouterr()
    before = snapshot(root)
    zipped = make_carton({"model/w": b"w" * 100, "out.carton": b"PK an old carton"})
    unlisted = make_carton({"model/w": b"w"}, manifest=manifest_for({"carton.toml": MINIMAL_TOML, "model/w": b"w"}))
    with zipfile.ZipFile(unlisted, "a") as z:
        z.writestr("junk/readme", b"not in MANIFEST")
    d = tmp_path / "dir"
    (d / "model").mkdir(parents=True)
    (d / "carton.toml").write_bytes(MINIMAL_TOML)
    (d / "model" / "w").write_bytes(b"w")
    (d / "out.carton").write_bytes(b"PK stale")
    for source, named in [(zipped, "out.carton"), (unlisted, "junk/"), (d, "out.carton")]:
        assert main(["add", str(source), "--root", str(root), "--progress", "none"]) == 4
        err = capsys.readouterr().err
        assert f"error: {named}: outside the carton format, in {source}" in err
        assert main(["path", str(source), "--root", str(root), "--progress", "none"]) == 4
        capsys.readouterr()
        assert snapshot(root) == before


def test_a_carton_already_stored_is_not_checked_for_its_top_level_again(make_carton) -> None:
    """Export and the refetch of evicted blobs re-read cartons the store
    accepted before the top level was checked: they must keep working."""
    from cartonstore.carton.checks import check_carton
    from cartonstore.sources import open_local

    extra = make_carton({"model/w": b"w" * 100, "NOTES.txt": b"an old note"})
    view = open_local(extra, ZipLimits())
    try:
        with pytest.raises(InvalidCarton, match="NOTES.txt: outside the carton format"):
            check_carton(view)
        checked = check_carton(view, top_level=False)
    finally:
        view.close()
    assert "NOTES.txt" in {e.path for e in checked.entries}


def test_entries_outside_the_format_are_refused_before_any_file_is_read(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale out.carton or a .git/ may be gigabytes: pack and add refuse
    them from the listing, without reading (or, for add, copying) a file."""
    from cartonstore.sources.dir_source import DirCartonView

    src = tmp_path / "m"
    (src / "model").mkdir(parents=True)
    (src / "carton.toml").write_bytes(MINIMAL_TOML)
    (src / "model" / "w").write_bytes(b"w" * 1000)
    (src / ".git").mkdir()
    (src / ".git" / "pack").write_bytes(b"p" * 100_000)
    opened: list[str] = []
    original = DirCartonView.open

    def counting(self: DirCartonView, path: str) -> BinaryIO:
        opened.append(path)
        return original(self, path)

    monkeypatch.setattr(DirCartonView, "open", counting)
    with pytest.raises(InvalidCarton, match=r"\.git/: outside the carton format"):
        pack_directory(src, tmp_path / "out.carton")
    with Store(tmp_path / "root") as store, pytest.raises(InvalidCarton, match=r"\.git/: outside the carton format"):
        store.add(src)
    assert opened == []
