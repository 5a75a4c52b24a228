"""A container that mounts the store read-only reads models and resolves
them through the daemon's socket. (A read-only bind mount needs root; the
test is skipped otherwise.)"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST
from kit.daemonkit import DaemonProcess

from cartonstore.cli.commands import main
from cartonstore.client.leases import Client


@pytest.fixture
def ro_view(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    src, view = tmp_path / "root", tmp_path / "container-view"
    src.mkdir()
    view.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    if subprocess.run(["mount", "--bind", str(src), str(view)], capture_output=True).returncode != 0:
        pytest.skip("bind mounts are not allowed here")
    subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
    yield src, view
    subprocess.run(["umount", "-l", str(view)], capture_output=True)


@pytest.mark.slow
def test_read_only_view_through_the_socket(ro_view, short_tmp: Path, capsys) -> None:
    root, view = ro_view
    assert main(["add", str(FIXTURE_CARTON), "--name", "fx", "--root", str(root), "--progress", "none"]) == 0
    with pytest.raises(OSError):
        (view / "probe").write_text("x")  # the container's view really is read-only
    with (DaemonProcess(root, listen=None, socket_path=short_tmp / "d.sock") as d,
          Client(d.socket_path).lease("fx") as model_dir):
        inside = view / Path(model_dir).relative_to(root)  # the same directory, as the container sees it
        manifest = (inside / "MANIFEST").read_bytes()
        assert hashlib.sha256(manifest).hexdigest() == FIXTURE_DIGEST
        for line in manifest.decode().splitlines():
            path, digest = line.rsplit("=", 1)
            assert hashlib.sha256((inside / path).read_bytes()).hexdigest() == digest
