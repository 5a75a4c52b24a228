"""A carton's files are staged several at once (one worker per core): the
result is the same as one at a time, and a bad file anywhere still leaves
the store exactly as it was, naming the first bad file in file order."""

from __future__ import annotations

import os
import threading
import zipfile
from typing import Any

import pytest
from conftest import MINIMAL_TOML, manifest_for, sha, snapshot, work_in_tmp

from cartonstore.errors import ManifestMismatch
from cartonstore.sources.zip_source import ZipCartonView
from cartonstore.store import Store, ingest

FILES = {f"model/part{i}.bin": os.urandom(300_000 + i) for i in range(6)}


@pytest.fixture(params=[1, 4], ids=["one-worker", "four-workers"])
def workers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(ingest, "STAGE_WORKERS", request.param)
    return request.param


@pytest.mark.parametrize("method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"])
def test_files_staged_at_once_are_the_files(store: Store, make_carton, workers: int, method: int) -> None:
    carton = make_carton(dict(FILES), method=method)
    digest = store.add(carton).digest
    model = store.materialize(digest)
    for path, data in FILES.items():
        assert (model / path).read_bytes() == data
        assert store.blobs.has(sha(data))
    assert store.verify().ok and work_in_tmp(store.layout.root) == []


def test_the_copies_run_in_several_threads(store: Store, make_carton, workers: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen: set[str] = set()
    original = ZipCartonView.raw_span

    def recording(self: ZipCartonView, path: str) -> Any:
        seen.add(threading.current_thread().name)
        return original(self, path)

    monkeypatch.setattr(ZipCartonView, "raw_span", recording)
    store.add(make_carton(dict(FILES)))
    assert len(seen) == workers or (workers > 1 and len(seen) > 1)
    assert all(name.startswith("cartonstore-ingest") for name in seen) == (workers > 1)


def test_a_bad_file_among_many_changes_nothing_and_is_named(store: Store, make_carton, workers: int) -> None:
    store.add(make_carton({"carton.toml": MINIMAL_TOML, "model/kept.bin": b"k" * 1000}, name="kept.carton"))
    before = snapshot(store.layout.root)
    files = {"carton.toml": MINIMAL_TOML, **FILES}
    listed = manifest_for(files)
    bad = dict(files)
    bad["model/part2.bin"] = b"x" + FILES["model/part2.bin"][1:]   # the first bad one in file order
    bad["model/part4.bin"] = b"y" + FILES["model/part4.bin"][1:]
    with pytest.raises(ManifestMismatch) as caught:
        store.add(make_carton(bad, manifest=listed))
    assert "model/part2.bin" in str(caught.value)
    assert snapshot(store.layout.root) == before
    assert work_in_tmp(store.layout.root) == []

