"""An unpacked directory without a MANIFEST is read and hashed once (issue 11
§2): its MANIFEST is computed as its files are staged, and a file that
changes meanwhile is still caught."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import MINIMAL_TOML, snapshot, work_in_tmp

from cartonstore.carton.pack import pack_directory
from cartonstore.errors import IntegrityError, ManifestMismatch
from cartonstore.sources.dir_source import DirCartonView
from cartonstore.store import Store


def unpacked(tmp_path: Path, big: int = 1 << 20) -> Path:
    src = tmp_path / "unpacked"
    (src / "model").mkdir(parents=True)
    (src / "carton.toml").write_bytes(MINIMAL_TOML)
    (src / "model" / "a.bin").write_bytes(os.urandom(big))
    (src / "model" / "b.bin").write_bytes(b"b" * 5000)
    (src / "model" / "same-as-b.bin").write_bytes(b"b" * 5000)
    return src


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """How often each file of a directory source is opened (the view's own seam)."""
    counts: Counter = Counter()
    original = DirCartonView.open

    def counting(self: DirCartonView, path: str) -> Any:
        counts[path] += 1
        return original(self, path)

    monkeypatch.setattr(DirCartonView, "open", counting)
    return counts


def test_each_file_of_an_unpacked_directory_is_read_once(store: Store, tmp_path: Path, opens: Counter) -> None:
    src = unpacked(tmp_path)
    r = store.add(src)
    assert opens["model/a.bin"] == 1 and opens["model/b.bin"] == 1 and opens["model/same-as-b.bin"] == 1, opens
    assert opens["carton.toml"] <= 2, opens  # hashed, then parsed and checked against MANIFEST
    packed = pack_directory(src, tmp_path / "same.carton")
    assert r.digest == packed.digest and r.complete and r.blobs_added == 4  # toml, a, b, MANIFEST
    assert store.verify().ok and work_in_tmp(store.root) == []
    opens.clear()
    again = store.add(src)  # everything already stored: read once, nothing left behind
    assert again.digest == r.digest and again.blobs_added == 0
    assert opens["model/a.bin"] == 1, opens
    assert work_in_tmp(store.root) == []


def _rchar() -> int:
    """Bytes this process has read through read(2) and friends (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_a_large_unpacked_file_is_read_from_disk_once(store: Store, tmp_path: Path) -> None:
    size = 48 << 20
    src = unpacked(tmp_path, big=size)
    before = _rchar()
    store.add(src)
    read = _rchar() - before
    assert size <= read < size * 1.5, f"read {read} bytes for a {size}-byte directory"


def test_a_file_changed_after_it_was_hashed_is_caught(store: Store, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """carton.toml is read again to be parsed: bytes that changed since the
    MANIFEST was computed do not match it, and nothing is stored."""
    src = unpacked(tmp_path)
    original = DirCartonView.open
    seen: Counter = Counter()

    def changing(self: DirCartonView, path: str) -> Any:
        seen[path] += 1
        if path == "carton.toml" and seen[path] == 2:
            (src / "carton.toml").write_bytes(MINIMAL_TOML.replace(b'"tiny"', b'"other"'))
        return original(self, path)

    monkeypatch.setattr(DirCartonView, "open", changing)
    before = snapshot(store.root)
    with pytest.raises(ManifestMismatch, match="carton.toml: does not match MANIFEST"):
        store.add(src)
    assert snapshot(store.root) == before and work_in_tmp(store.root) == []


def test_a_file_that_grows_while_it_is_added_is_an_error(store: Store, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    src = unpacked(tmp_path)
    original = DirCartonView.open

    def growing(self: DirCartonView, path: str) -> Any:
        if path == "model/a.bin":
            with open(src / path, "ab") as f:
                f.write(b"more")
        return original(self, path)

    monkeypatch.setattr(DirCartonView, "open", growing)
    before = snapshot(store.root)
    with pytest.raises(IntegrityError, match="model/a.bin: changed while it was read"):
        store.add(src)
    assert snapshot(store.root) == before and work_in_tmp(store.root) == []
