"""Cartons by URL: the zip's end and only the entries the store lacks."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, MINIMAL_TOML
from kit.fetchkit import URLS_ONLY, blob_files, fast_config, linked_carton, pull, tmp_files
from kit.origin import Fault

from cartonstore.carton.pack import pack_directory
from cartonstore.errors import CartonStoreError, FetchError, ManifestMismatch
from cartonstore.fetch.puller import Puller
from cartonstore.fetch.sources.remote_zip import plan_requests
from cartonstore.store import Store


def test_plan_requests_merges_close_spans() -> None:
    assert plan_requests([(0, 10), (12, 20), (100, 110)], gap=5) == [(0, 20), (100, 110)]
    assert plan_requests([(50, 60), (0, 10)], gap=0) == [(0, 10), (50, 60)]
    assert plan_requests([], gap=10) == []


def test_fixture_by_url(store: Store, origin) -> None:
    origin.put("/m.carton", FIXTURE_CARTON.read_bytes())
    r = pull(store, origin.url("/m.carton"))
    assert r.digest == FIXTURE_DIGEST and r.complete
    assert all(req.range for req in origin.requests), "every request is a Range request"
    assert store.verify().ok
    assert store.info(FIXTURE_DIGEST).row.source == origin.url("/m.carton")


def make_model(tmp_path: Path, name: str, shared: bytes, own: bytes) -> Path:
    src = tmp_path / name
    (src / "model").mkdir(parents=True)
    (src / "carton.toml").write_bytes(MINIMAL_TOML.replace(b'"tiny"', f'"{name}"'.encode()))
    (src / "model" / "shared.bin").write_bytes(shared)
    (src / "model" / "own.bin").write_bytes(own)
    return src


@pytest.mark.parametrize("compression", ["stored", "deflate", "zstd"])
def test_second_carton_transfers_only_what_is_new(store: Store, tmp_path: Path, origin, compression: str) -> None:
    shared = os.urandom(4 << 20)
    a = pack_directory(make_model(tmp_path, "a", shared, os.urandom(1000)), tmp_path / "a.carton",
                       compression=compression)
    b = pack_directory(make_model(tmp_path, "b", shared, os.urandom(300_000)), tmp_path / "b.carton",
                       compression=compression)
    origin.put_file("/a.carton", a.path)
    origin.put_file("/b.carton", b.path)
    pull(store, origin.url("/a.carton"))
    before = origin.bytes_sent
    r = pull(store, origin.url("/b.carton"))
    sent = origin.bytes_sent - before
    assert r.complete and r.digest == b.digest
    assert sent < 300_000 + 200_000, f"sent {sent} bytes for a carton whose new bytes are ~300 kB"
    assert sent == r.bytes_received
    assert (asyncio.run(_materialize(store, "b")) / "model" / "shared.bin").read_bytes() == shared


def test_an_evicted_blob_comes_back_when_the_server_stopped_taking_range(store: Store, origin) -> None:
    victim = _pulled_then_evicted(store, origin, "misc/model_architecture.png")
    origin.set_fault("/m.carton", Fault(ignore_range=True))  # now one whole download is the only way
    model = asyncio.run(_materialize(store, FIXTURE_DIGEST))
    assert (model / "misc" / "model_architecture.png").stat().st_size == victim.size
    assert store.verify().ok and tmp_files(store) == []


def _pulled_then_evicted(store: Store, origin, path: str) -> str:
    """The fixture added from the origin by URL, then one entry's blob gone (as gc evicts)."""
    origin.put("/m.carton", FIXTURE_CARTON.read_bytes())
    pull(store, origin.url("/m.carton"))
    victim = next(e for e in store.index.entries(FIXTURE_DIGEST) if e.path == path)
    os.unlink(store.blobs.path(victim.digest))
    store.index.forget_blob(victim.digest)
    return victim


async def _materialize(store: Store, ref: str) -> Path:
    async with Puller(store, fast_config(), sources=URLS_ONLY) as p:
        return await p.materialize(ref)


def test_server_that_ignores_range_gets_one_whole_download(store: Store, origin) -> None:
    origin.put("/m.carton", FIXTURE_CARTON.read_bytes(), fault=Fault(ignore_range=True))
    r = pull(store, origin.url("/m.carton"))
    assert r.digest == FIXTURE_DIGEST and r.complete
    assert origin.count("/m.carton") == 2  # the Range probe (answered 200, body unread) and the download
    assert tmp_files(store) == []


def test_wrong_content_range_is_an_error(store: Store, origin) -> None:
    origin.put("/m.carton", FIXTURE_CARTON.read_bytes(), fault=Fault(wrong_content_range=True))
    with pytest.raises(FetchError, match="Content-Range"):
        pull(store, origin.url("/m.carton"))
    assert blob_files(store) == [] and tmp_files(store) == []


def test_remote_carton_with_wrong_bytes_is_rejected(store: Store, tmp_path: Path, origin) -> None:
    from conftest import carton_entries, manifest_for, write_zip

    files = {"carton.toml": MINIMAL_TOML, "model/w.bin": b"good bytes"}
    bad = write_zip(tmp_path / "bad.carton", [("carton.toml", MINIMAL_TOML), ("model/w.bin", b"evil bytes"),
                                              ("MANIFEST", manifest_for(files))])
    origin.put_file("/bad.carton", bad)
    with pytest.raises(ManifestMismatch, match="model/w.bin.*MANIFEST"):
        pull(store, origin.url("/bad.carton"))
    assert blob_files(store) == [] and tmp_files(store) == []
    assert carton_entries  # helper imported for symmetry with other tests


def test_remote_carton_transient_faults(store: Store, origin) -> None:
    origin.put("/m.carton", FIXTURE_CARTON.read_bytes(), fault=Fault(status_sequence=[503, 500], reset_at=5000, times=1))
    assert pull(store, origin.url("/m.carton")).digest == FIXTURE_DIGEST
    assert store.verify().ok


def test_truncated_remote_zip(store: Store, origin) -> None:
    origin.put("/m.carton", FIXTURE_CARTON.read_bytes()[:-5000])
    with pytest.raises(CartonStoreError, match="zip|central|end"):
        pull(store, origin.url("/m.carton"))
    assert blob_files(store) == []


def test_in_process_callers_share_one_download(store: Store, tmp_path: Path, origin) -> None:
    blobs = {f"model/{i}.bin": os.urandom(200_000) for i in range(3)}
    carton, shas = linked_carton(tmp_path, origin, blobs)
    origin.put_file("/c.carton", carton)

    async def many() -> list:
        async with Puller(store, fast_config(), sources=URLS_ONLY) as p:
            return await asyncio.gather(*(p.add(origin.url("/c.carton")) for _ in range(20)))

    results = asyncio.run(many())
    assert {r.digest for r in results} == {results[0].digest}
    for digest in shas.values():
        assert origin.count(f"/blobs/{digest}") == 1


def test_processes_share_one_download(tmp_path: Path, origin) -> None:
    blobs = {f"model/{i}.bin": os.urandom(300_000) for i in range(3)}
    carton, shas = linked_carton(tmp_path, origin, blobs)
    origin.put_file("/c.carton", carton)
    for digest in shas.values():  # slow the blobs so the processes overlap
        origin.set_fault(f"/blobs/{digest}", Fault(delay=0.3))
    root = tmp_path / "root"
    procs = [subprocess.Popen([sys.executable, "-m", "cartonstore.cli", "add", origin.url("/c.carton"),
                               "--root", str(root), "--progress", "none"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    outs = [(p.wait(120), p.stdout.read(), p.stderr.read()) for p in procs]
    assert all(code == 0 for code, _, _ in outs), outs
    assert len({out.splitlines()[-1] for _, out, _ in outs}) == 1
    for digest in shas.values():
        assert origin.count(f"/blobs/{digest}") == 1, digest
    with Store(root) as s:
        assert s.verify().ok


def test_cli_add_url_and_path(tmp_path: Path, origin, capsys) -> None:
    from cartonstore.cli.commands import main

    origin.put("/m.carton", FIXTURE_CARTON.read_bytes())
    root = str(tmp_path / "root")
    assert main(["add", origin.url("/m.carton"), "--root", root, "--progress", "json"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == FIXTURE_DIGEST
    assert '"event": "done"' in err
    assert main(["path", FIXTURE_DIGEST[:12], "--root", root]) == 0
    assert capsys.readouterr().out.strip().endswith(FIXTURE_DIGEST)
    code = main(["add", "ftp://example.com/m.carton", "--root", root])
    assert code == 4 and "'ftp' is not allowed" in capsys.readouterr().err


def test_an_evicted_in_zip_blob_comes_back_from_the_zip(store: Store, origin) -> None:
    victim = _pulled_then_evicted(store, origin, "misc/model_architecture.png")
    origin.reset_counts()
    model = asyncio.run(_materialize(store, FIXTURE_DIGEST))
    assert (model / "misc" / "model_architecture.png").stat().st_size == victim.size
    assert origin.bytes_sent < victim.size + 200_000  # that entry (and metadata), not the whole zip
    assert store.verify().ok
