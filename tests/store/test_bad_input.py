"""Every bad carton gets a clear error, a non-zero exit, and changes nothing.

Each case is added through the real CLI entry point against a store that
already holds a carton; the store is snapshotted (files, modes, index rows,
tmp/) before and after.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURE_CARTON, MINIMAL_TOML, carton_entries, manifest_for, sha, snapshot, write_zip

from cartonstore.cli.commands import main

GOOD = {"carton.toml": MINIMAL_TOML, "model/w.bin": b"weights"}


def st_file(tensors: dict, data_len: int, *, header_size: int | None = None, raw_header: bytes | None = None) -> bytes:
    header = raw_header if raw_header is not None else json.dumps(tensors).encode()
    n = len(header) if header_size is None else header_size
    return struct.pack("<Q", n) + header + b"\0" * data_len


def tensor_toml(dtype: str, shape: list[int], file: str) -> bytes:
    return f'[[tensor]]\nname = "t"\ndtype = "{dtype}"\nshape = {shape}\nfile = "{file}"\n'.encode()


def symlink_zip(path: Path, files: dict[str, bytes], link: str, target: str, listed_as: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        info = zipfile.ZipInfo(link)
        info.create_system = 3
        info.external_attr = 0o120777 << 16
        z.writestr(info, target)
        z.writestr("MANIFEST", manifest_for({**files, link: listed_as}))
    return path


def patch_all(data: bytes, old: bytes, new: bytes) -> bytes:
    assert old in data
    return data.replace(old, new)


def lying_size_zip(path: Path) -> Path:
    """A deflated entry whose headers declare fewer bytes than it inflates to."""
    big = b"A" * 100_000
    files = {**GOOD, "model/big.bin": big}
    write_zip(path, carton_entries(files), method=zipfile.ZIP_DEFLATED)
    raw = path.read_bytes()
    return _write(path, patch_all(raw, struct.pack("<I", 100_000), struct.pack("<I", 1000)))


def huge_declared_zip(path: Path) -> Path:
    """A small deflated entry that declares 4 GB: a ratio no honest file has."""
    files = {**GOOD, "model/big.bin": b"A" * 50_000}
    write_zip(path, carton_entries(files), method=zipfile.ZIP_DEFLATED)
    raw = path.read_bytes()
    return _write(path, patch_all(raw, struct.pack("<I", 50_000), struct.pack("<I", 0xF0000000)))


def many_entries_zip(path: Path) -> Path:
    """An end record that claims ten million entries."""
    write_zip(path, carton_entries(GOOD))
    raw = bytearray(path.read_bytes())
    eocd = raw.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", raw, eocd + 8, 0xFFFE, 0xFFFE)
    return _write(path, bytes(raw))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def truncated(path: Path, keep: float) -> Path:
    data = FIXTURE_CARTON.read_bytes()
    return _write(path, data[: int(len(data) * keep)])


def corrupted(method: int) -> Callable[[Path], Path]:
    """A carton of fresh bytes (the store cannot skip them as present)
    with its compressed data damaged in the middle."""
    def build(path: Path) -> Path:
        from cartonstore.zipfmt import ZipReader, ZipWriter

        files = {**GOOD, "model/fresh.bin": os.urandom(20_000) * 5}
        with ZipWriter(path) as zw:
            for name, data in carton_entries(files):
                zw.add_bytes(name, data, method=method)
        with ZipReader(path) as z:  # the entry's data, wherever alignment padding put it
            offset, length = z.data_span(next(e for e in z.entries if e.name == "model/fresh.bin"))
        data = bytearray(path.read_bytes())
        start = offset + length // 2
        for i in range(start, start + 64):
            data[i] ^= 0x5A
        return _write(path, bytes(data))
    return build


def zip_of(entries) -> Callable[[Path], Any]:
    return lambda p: write_zip(p, entries)


def carton_of(files, **kw) -> Callable[[Path], Any]:
    return lambda p: write_zip(p, carton_entries(files, **kw))


SAFETENSORS_CASES = {
    "header too large": (st_file({}, 0, header_size=200_000_000), "header"),
    "overlapping offsets": (st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                     "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, 12), "overlap|inside"),
    "hole between tensors": (st_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                      "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, 12), "hole|gap|contiguous"),
    "offsets past the end": (st_file({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 8), "end|past|size"),
    "not a JSON object": (st_file({}, 0, raw_header=b"[1, 2]"), r"\{|object"),
    "shape disagrees with offsets": (st_file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, 8), "shape|size|bytes"),
}

CASES = {
    "entry with ..": (zip_of([*carton_entries(GOOD), ("model/../../evil", b"x")]), r"\.\."),
    "absolute entry": (zip_of([*carton_entries(GOOD), ("/etc/passwd", b"x")]), "absolute"),
    "backslash entry": (zip_of([*carton_entries(GOOD), ("model\\evil.bin", b"x")]), "backslash"),
    "drive letter entry": (zip_of([*carton_entries(GOOD), ("C:/evil.bin", b"x")]), "drive"),
    "duplicate entry": (zip_of([*carton_entries(GOOD), ("model/w.bin", b"weights")]), "more than once"),
    "entry not in MANIFEST": (zip_of([*carton_entries(GOOD), ("model/extra.bin", b"x")]), "not listed in MANIFEST"),
    "MANIFEST line without entry or link": (carton_of(GOOD, omit=("model/w.bin",)), "neither in the carton nor in LINKS"),
    "bytes do not match MANIFEST": (zip_of([("carton.toml", MINIMAL_TOML), ("model/w.bin", b"tampered"),
                                            ("MANIFEST", manifest_for(GOOD))]), "model/w.bin.*MANIFEST"),
    "carton.toml does not match MANIFEST": (zip_of([("carton.toml", MINIMAL_TOML + b"\n"), ("model/w.bin", b"weights"),
                                                    ("MANIFEST", manifest_for(GOOD))]), "carton.toml.*MANIFEST"),
    "no MANIFEST": (zip_of([("carton.toml", MINIMAL_TOML), ("model/w.bin", b"weights")]), "MANIFEST.*missing"),
    "unsorted MANIFEST": (carton_of(GOOD, manifest=b"model/w.bin=" + sha(b"weights").encode() + b"\ncarton.toml="
                                    + sha(MINIMAL_TOML).encode() + b"\n"), "MANIFEST.*(sort|order)"),
    "declared size smaller than actual": (lying_size_zip, "model/big.bin"),
    "compression ratio too high": (huge_declared_zip, "ratio"),
    "end record claims more entries than it holds": (many_entries_zip, "entries"),
    "truncated zip (half)": (lambda p: truncated(p, 0.5), "zip|truncat|central"),
    "truncated zip (end record cut)": (lambda p: truncated(p, 0.9999), "zip|truncat|central|end"),
    "corrupted deflate data": (corrupted(8), "model/fresh.bin"),
    "corrupted zstd data": (corrupted(93), "model/fresh.bin"),
    "corrupted stored data": (corrupted(0), "model/fresh.bin"),
    "not a zip at all": (lambda p: _write(p, b"hello, I am not a zip" * 100), "zip|end of central"),
    "invalid TOML": (carton_of({**GOOD, "carton.toml": b"spec_version = = 1\n"}), "carton.toml"),
    "carton.toml without runner": (carton_of({**GOOD, "carton.toml": b"spec_version = 1\n"}), "carton.toml.*runner"),
    "carton.toml without runner_name": (carton_of({**GOOD, "carton.toml": b"spec_version = 1\n[runner]\n"
                                                   b"required_framework_version = \"1\"\n"}), "runner_name"),
    "spec_version 2": (carton_of({**GOOD, "carton.toml": MINIMAL_TOML.replace(b"spec_version = 1", b"spec_version = 2")}),
                       "spec_version"),
    "tensor .bin size disagrees with shape": (carton_of({**GOOD, "tensor_data/index.toml": tensor_toml("float32", [2, 3], "t.bin"),
                                                         "tensor_data/t.bin": b"\0" * 20}), "t.bin|24|20"),
    "symlink escaping model/": (lambda p: symlink_zip(p, GOOD, "model/link", "../../etc/passwd", b"x"), "model/link"),
    "symlink with wrong MANIFEST hash": (lambda p: symlink_zip(p, GOOD, "model/link", "w.bin", b"other"), "model/link"),
    **{f"safetensors: {k}": (carton_of({**GOOD, "model/m.safetensors": data}), f"model/m.safetensors.*({rx})")
       for k, (data, rx) in SAFETENSORS_CASES.items()},
}


@pytest.fixture
def populated_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    assert main(["add", str(FIXTURE_CARTON), "--root", str(root)]) == 0
    return root


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_carton_is_rejected_and_changes_nothing(case: str, populated_root: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    build, pattern = CASES[case]
    bad = build(tmp_path / "bad.carton")
    capsys.readouterr()
    before = snapshot(populated_root)
    code = main(["add", str(bad), "--root", str(populated_root)])
    err = capsys.readouterr().err
    assert code != 0, f"{case}: accepted"
    assert err.startswith("cartonstore add: error: "), err
    import re

    assert re.search(pattern, err, re.IGNORECASE | re.DOTALL), f"{case}: unclear error: {err}"
    assert snapshot(populated_root) == before, f"{case}: the store changed"


@pytest.mark.parametrize("limits,make,pattern", [
    ({"max_entries": 5}, lambda files: files, "entries"),
    ({"max_ratio": 10, "ratio_floor": 1000}, lambda files: {**files, "model/zeros.bin": b"\0" * 200_000}, "ratio"),
])
def test_zip_limits_of_the_store_apply(tmp_path: Path, limits: dict, make, pattern: str) -> None:
    from cartonstore.errors import InvalidCarton
    from cartonstore.store import Store
    from cartonstore.zipfmt import ZipLimits

    files = make({**GOOD, **{f"model/f{i}": str(i).encode() for i in range(6)}})
    bad = write_zip(tmp_path / "many.carton", carton_entries(files), method=zipfile.ZIP_DEFLATED)
    with Store(tmp_path / "root", zip_limits=ZipLimits(**limits)) as store:
        before = snapshot(store.root)
        with pytest.raises(InvalidCarton, match=pattern):
            store.add(bad)
        assert snapshot(store.root) == before
