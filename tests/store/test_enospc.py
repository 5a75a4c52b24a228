"""A full disk: clear errors, tmp/ cleaned, nothing half-written, and the
store (and daemon) keep serving what they have.

Needs a small filesystem: the test mounts a tmpfs when it runs as root and
is skipped otherwise (mounting needs CAP_SYS_ADMIN).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, work_in_tmp

from cartonstore.errors import FetchError, Unavailable
from cartonstore.store import Store


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    mnt = tmp_path / "small"
    mnt.mkdir()

    def mount(size: str, inodes: int = 4096) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs to fill needs root")
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},nr_inodes={inodes}", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
        return mnt

    yield mount
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _big_dir(tmp_path: Path, size: int) -> Path:
    src = tmp_path / "big"
    (src / "model").mkdir(parents=True)
    (src / "carton.toml").write_bytes(b'spec_version = 1\nmodel_name = "big"\n[runner]\nrunner_name = "x"\n'
                                      b'required_framework_version = "1"\n')
    (src / "model" / "w.bin").write_bytes(os.urandom(size))
    return src


def test_add_on_a_full_disk(small_fs, tmp_path: Path) -> None:
    root = small_fs("4m") / "root"
    with Store(root) as store:
        assert store.add(FIXTURE_CARTON).digest == FIXTURE_DIGEST
        before = sorted(store.blobs.iter_digests())
        with pytest.raises(Unavailable, match="no space left on device"):
            store.add(_big_dir(tmp_path, 6 << 20))
        assert work_in_tmp(root) == []
        assert sorted(store.blobs.iter_digests()) == before
        assert store.verify().ok
        assert (store.materialize(FIXTURE_DIGEST) / "model" / "main.py").is_file()


def test_fetch_on_a_full_disk(small_fs, tmp_path: Path, origin) -> None:
    from kit.fetchkit import linked_carton, pull

    root = small_fs("3m") / "root"
    carton, shas = linked_carton(tmp_path, origin, {"model/w.bin": os.urandom(5 << 20)})
    with Store(root) as store:
        with pytest.raises(FetchError, match="no space left on device"):
            pull(store, str(carton))
        assert work_in_tmp(root) == []
        assert not store.blobs.has(shas["model/w.bin"])
        assert store.verify().ok


def test_materialize_out_of_inodes(small_fs, tmp_path: Path) -> None:
    root = small_fs("8m", inodes=400) / "root"
    with Store(root) as store:
        d = store.add(FIXTURE_CARTON).digest
        filler = root.parent / "filler"
        filler.mkdir()
        n = 0
        with pytest.raises(OSError):
            while True:
                (filler / str(n)).touch()
                n += 1
        with pytest.raises(Unavailable, match="no space left on device"):
            store.materialize(d)
        assert not (root / "models" / d).exists()
        assert work_in_tmp(root) == []
        for f in list(filler.iterdir())[:50]:
            f.unlink()
        assert (store.materialize(d) / "model" / "main.py").is_file()
        assert store.verify().ok


def test_daemon_keeps_serving_on_a_full_disk(small_fs, tmp_path: Path, short_tmp: Path, capsys) -> None:
    from kit.daemonkit import DaemonProcess, unix_session

    from cartonstore.cli.commands import main

    root = small_fs("4m") / "root"
    assert main(["add", str(FIXTURE_CARTON), "--name", "fx", "--root", str(root), "--progress", "none"]) == 0
    big = _big_dir(tmp_path, 6 << 20)
    with DaemonProcess(root, listen=None, socket_path=short_tmp / "d.sock") as d:
        async def scenario() -> tuple[int, str, int]:
            async with unix_session(d.socket_path) as s:
                async with s.post("/v2/repository/models/big/load", json={"parameters": {"source": str(big)}}) as r:
                    failed, text = r.status, await r.text()
                async with s.post("/v1/leases", json={"model": "fx"}) as r:
                    return failed, text, r.status

        failed, text, lease_status = asyncio.run(scenario())
        assert failed == 503 and "no space left on device" in text
        assert lease_status == 200
    assert work_in_tmp(root) == []
