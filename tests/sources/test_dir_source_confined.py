"""A confined directory view (a carton a caller named to the daemon) reads
nothing outside its directory, even when the directory changes between its
listing and the read."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cartonstore.errors import InvalidCarton
from cartonstore.sources.dir_source import DirCartonView


def carton_dir(root: Path) -> Path:
    (root / "model" / "sub").mkdir(parents=True)
    (root / "carton.toml").write_text('spec_version = 1\nmodel_name = "m"\n')
    (root / "model" / "sub" / "w.bin").write_bytes(b"inside")
    return root


def test_a_directory_swapped_for_a_link_after_the_listing_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "w.bin").write_bytes(b"the daemon's secret")
    root = carton_dir(tmp_path / "c")
    confined, trusting = DirCartonView(root, confined=True), DirCartonView(root)
    shutil.rmtree(root / "model" / "sub")
    os.symlink(outside, root / "model" / "sub")
    with pytest.raises(InvalidCarton, match="model/sub/w.bin"):
        confined.open("model/sub/w.bin")
    with trusting.open("model/sub/w.bin") as f:   # the CLI's own files: followed, as before
        assert f.read() == b"the daemon's secret"


def test_a_file_swapped_for_a_link_after_the_listing_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"the daemon's secret")
    root = carton_dir(tmp_path / "c")
    view = DirCartonView(root, confined=True)
    (root / "model" / "sub" / "w.bin").unlink()
    os.symlink(secret, root / "model" / "sub" / "w.bin")
    with pytest.raises(InvalidCarton, match="outside the carton"):
        view.open("model/sub/w.bin")


def test_a_link_kept_inside_its_folder_is_read_where_it_points(tmp_path: Path) -> None:
    root = carton_dir(tmp_path / "c")
    os.symlink("sub/w.bin", root / "model" / "alias.bin")
    view = DirCartonView(root, confined=True)
    with view.open("model/alias.bin") as f:
        assert f.read() == b"inside"
