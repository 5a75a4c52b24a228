"""Eviction never makes a carton unrecoverable (issue 11, section 1).

gc evicts a blob only when it has a source to fetch it again: a LINKS URL,
the carton's own URL, or the local file it was added from, still with the
size and mtime recorded. What it keeps for lack of a source it names;
--forget-unrecoverable removes such cartons whole instead. Evicted blobs
come back by `path`, a lease and a daemon load, from the local file first.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import carton_entries, sha, write_zip

from cartonstore.cli.commands import main
from cartonstore.store import Store
from cartonstore.store.gc.plan import CartonUse, GcPolicy, Snapshot, plan_collection

NOW = 1_000_000.0
TOML = b'spec_version = 1\nmodel_name = "%s"\n[runner]\nrunner_name = "tensorflow"\nrequired_framework_version = "*"\n'


# -- the plan (pure) ------------------------------------------------------------


def use(digest: str, last_used: float, listed: set[str], *, leased: bool = False) -> CartonUse:
    return CartonUse(digest, last_used, True, leased, frozenset(listed), frozenset())


def snap(blobs: dict[str, int], cartons: list[CartonUse], unsourced: set[str]) -> Snapshot:
    return Snapshot({d: (s, 0.0) for d, s in blobs.items()}, {}, tuple(cartons), (), 10**12, NOW,
                    frozenset(unsourced))


def test_plan_never_evicts_a_blob_without_a_source() -> None:
    s = snap({"x": 100, "y": 100, "c1": 1, "c2": 1}, [use("c1", 1, {"x"}), use("c2", 2, {"y"})], {"x"})
    plan = plan_collection(s, GcPolicy(max_size=0))
    assert plan.evicted_blobs == {"y"}
    assert plan.kept == {"c1": {"x"}} and plan.forgotten == {}
    assert plan.evicted_models == ["c2"], "a model that loses nothing keeps its directory"


def test_plan_prefers_models_whose_blobs_can_all_come_back() -> None:
    # c1 is the least recently used, but one of its blobs has no source: c2 goes first.
    s = snap({"x": 100, "x2": 100, "y": 100, "c1": 1, "c2": 1},
             [use("c1", 1, {"x", "x2"}), use("c2", 2, {"y"})], {"x"})
    plan = plan_collection(s, GcPolicy(max_size=210))
    assert plan.evicted_blobs == {"y"} and plan.evicted_models == ["c2"] and plan.kept == {}
    plan = plan_collection(s, GcPolicy(max_size=0))
    assert plan.evicted_blobs == {"y", "x2"} and plan.kept == {"c1": {"x"}}
    assert plan.evicted_models == ["c2", "c1"], "c1 lost x2: its directory goes"


def test_plan_forgets_unrecoverable_cartons_whole_when_asked() -> None:
    s = snap({"x": 100, "shared": 50, "y": 100, "c1": 1, "c2": 1},
             [use("c1", 1, {"x", "shared"}), use("c2", 2, {"y", "shared"}, leased=True)], {"x", "shared"})
    plan = plan_collection(s, GcPolicy(max_size=0, forget_unrecoverable=True))
    assert plan.forgotten == {"c1": {"x", "c1"}}, "a blob another carton lists stays"
    assert plan.kept == {} and plan.evicted_blobs == set() and plan.evicted_models == []
    assert plan_collection(s, GcPolicy(max_size=0)).kept == {"c1": {"x"}}


def test_plan_keeps_everything_when_under_budget() -> None:
    s = snap({"x": 100, "c1": 1}, [use("c1", 1, {"x"})], {"x"})
    plan = plan_collection(s, GcPolicy(max_size=1000, forget_unrecoverable=True))
    assert plan.kept == {} and plan.forgotten == {} and plan.evicted_blobs == set()


# -- real stores, the real CLI and daemon ---------------------------------------------


def _files(name: str, size: int = 30_000) -> dict[str, bytes]:
    return {"carton.toml": TOML % name.encode(), "model/w.bin": os.urandom(size), "misc/note.txt": name.encode()}


def _zip(tmp_path: Path, name: str, method: int = zipfile.ZIP_STORED) -> tuple[Path, dict[str, bytes]]:
    files = _files(name)
    (tmp_path / "src").mkdir(exist_ok=True)
    return write_zip(tmp_path / "src" / f"{name}.carton", carton_entries(files), method=method), files


def _dir(tmp_path: Path, name: str) -> tuple[Path, dict[str, bytes]]:
    files = _files(name)
    for rel, data in files.items():
        (tmp_path / "src" / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name / rel).write_bytes(data)
    return tmp_path / "src" / name, files


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([*argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _missing(root: Path, name: str) -> list[str]:
    with Store(root) as s:
        return s.info(s.resolve(name)).missing_blobs


async def _lease(socket: Path, model: str) -> dict:
    from kit.daemonkit import unix_session

    async with unix_session(socket) as s:
        async with s.post("/v1/leases", json={"model": model, "ttl": 60}) as r:
            assert r.status == 200, await r.text()
            granted = await r.json()
        async with s.delete(f"/v1/leases/{granted['lease']}") as r:
            assert r.status == 200
    return granted


async def _post(socket: Path, path: str, body: dict) -> tuple[int, dict]:
    from kit.daemonkit import unix_session

    async with unix_session(socket) as s, s.post(path, json=body) as r:
        return r.status, await r.json(content_type=None)


@pytest.mark.slow
def test_every_kind_of_source_comes_back_by_path_lease_and_load(short_tmp: Path, origin, capsys) -> None:
    from kit.daemonkit import DaemonProcess
    from kit.fetchkit import linked_carton

    root = short_tmp / "root"
    expected: dict[str, bytes] = {}
    stored, files = _zip(short_tmp, "stored")
    expected["stored"] = files["model/w.bin"]
    deflated, files = _zip(short_tmp, "deflated", zipfile.ZIP_DEFLATED)
    expected["deflated"] = files["model/w.bin"]
    unpacked, files = _dir(short_tmp, "unpacked")
    expected["unpacked"] = files["model/w.bin"]
    expected["linked"] = os.urandom(30_000)
    linked, _ = linked_carton(short_tmp, origin, {"model/w.bin": expected["linked"]}, extra={
        "carton.toml": TOML % b"linked"})
    remote, files = _zip(short_tmp, "remote")
    expected["remote"] = files["model/w.bin"]
    origin.put("/remote.carton", remote.read_bytes())
    remote.unlink()  # only the URL holds it now
    sources = {"stored": str(stored), "deflated": str(deflated), "unpacked": str(unpacked),
               "linked": str(linked), "remote": origin.url("/remote.carton")}
    for name, src in sources.items():
        assert cli(capsys, "add", src, "--name", name, "--root", str(root), "--progress", "none")[0] == 0
        assert cli(capsys, "path", name, "--root", str(root))[0] == 0

    with DaemonProcess(root, listen=None) as d:
        def evict_all() -> dict:
            code, out, err = cli(capsys, "gc", "--max-size", "1", "--grace", "0s", "--root", str(root),
                                 "--socket", str(d.socket_path), "--json")
            assert code == 0, err
            report = json.loads(out)
            assert report["ran_in"] == "daemon" and report["kept_unrecoverable"] == []
            for name in sources:
                assert _missing(root, name), f"{name} was not evicted"
            return report

        evict_all()
        for name in sources:  # back by `path`
            code, out, err = cli(capsys, "path", name, "--root", str(root))
            assert code == 0, f"{name}: {err}"
            assert (Path(out.strip().splitlines()[-1]) / "model" / "w.bin").read_bytes() == expected[name]
            assert not _missing(root, name)

        evict_all()
        for name in sources:  # back by a lease
            granted = asyncio.run(_lease(d.socket_path, name))
            assert (Path(granted["path"]) / "model" / "w.bin").read_bytes() == expected[name], name

        evict_all()
        for name in sources:  # back by a daemon load (no source parameter: the name is known)
            status, body = asyncio.run(_post(d.socket_path, f"/v2/repository/models/{name}/load", {}))
            assert status == 200, (name, body)
            assert not _missing(root, name), name
            assert asyncio.run(_post(d.socket_path, f"/v2/repository/models/{name}/unload", {}))[0] == 200
    assert origin.count(f"/blobs/{sha_of(expected['linked'])}") == 4
    with Store(root) as s:
        assert s.verify().ok


def sha_of(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


@pytest.mark.slow
def test_an_upload_has_no_lasting_source_so_gc_keeps_it_or_forgets_it(daemon, tmp_path: Path, capsys) -> None:
    files = _files("up")
    carton = write_zip(tmp_path / "up.carton", carton_entries(files))
    params = {"file:1/model.carton": base64.b64encode(carton.read_bytes()).decode()}
    status, body = asyncio.run(_post(daemon.socket_path, "/v2/repository/models/up/load", {"parameters": params}))
    assert status == 200, body
    assert asyncio.run(_post(daemon.socket_path, "/v2/repository/models/up/unload", {}))[0] == 200
    root, sock = str(daemon.root), str(daemon.socket_path)
    with Store(root) as s:
        digest = s.resolve("up")

    code, out, _ = cli(capsys, "gc", "--max-size", "1", "--grace", "0s", "--root", root, "--socket", sock)
    assert code == 0
    assert "kept: 2 blob(s) (29.3 KiB) of model up: no source to fetch them again" in out, out
    assert not _missing(daemon.root, "up")
    granted = asyncio.run(_lease(daemon.socket_path, "up"))
    assert (Path(granted["path"]) / "model" / "w.bin").read_bytes() == files["model/w.bin"]

    code, out, _ = cli(capsys, "gc", "--max-size", "1", "--grace", "0s", "--root", root, "--socket", sock,
                       "--forget-unrecoverable", "--dry-run")
    assert code == 0 and f"would forget model up ({digest}, " in out, out
    assert not _missing(daemon.root, "up")
    code, out, _ = cli(capsys, "gc", "--max-size", "1", "--grace", "0s", "--root", root, "--socket", sock,
                       "--forget-unrecoverable", "--json")
    report = json.loads(out)
    assert [m["manifest_sha256"] for m in report["forgotten_models"]] == [digest]
    assert report["forgotten_models"][0]["names"] == ["up"] and report["partial_models"] == []
    assert cli(capsys, "path", "up", "--root", root)[0] == 3
    with Store(root) as s:
        assert s.verify().ok and not any(s.blobs.iter_digests())


def test_a_source_moved_away_before_gc_keeps_its_blobs(tmp_path: Path, capsys) -> None:
    root = str(tmp_path / "root")
    moved, files = _zip(tmp_path, "moved", zipfile.ZIP_DEFLATED)
    kept_dir, _ = _dir(tmp_path, "unpacked")
    for src in (moved, kept_dir):
        assert cli(capsys, "add", str(src), "--root", root, "--progress", "none")[0] == 0
    shutil.move(moved, tmp_path / "elsewhere.carton")
    code, out, _ = cli(capsys, "gc", "--local", "--max-size", "1", "--grace", "0s", "--root", root, "--dry-run")
    assert "would keep: 2 blob(s) (29.3 KiB) of model moved: no source to fetch them again" in out, out
    code, out, _ = cli(capsys, "gc", "--local", "--max-size", "1", "--grace", "0s", "--root", root)
    assert "kept: 2 blob(s) (29.3 KiB) of model moved: no source to fetch them again" in out, out
    assert "1 model(s) now partial: unpacked" in out
    assert not _missing(Path(root), "moved") and _missing(Path(root), "unpacked")
    code, out, _ = cli(capsys, "path", "moved", "--root", root)
    assert code == 0 and (Path(out.split()[-1]) / "model" / "w.bin").read_bytes() == files["model/w.bin"]

    assert cli(capsys, "path", "unpacked", "--root", root)[0] == 0  # back from the directory
    assert not _missing(Path(root), "unpacked")
    # A file modified after the add is no source either.
    (kept_dir / "model" / "w.bin").write_bytes(b"changed")
    code, out, _ = cli(capsys, "gc", "--local", "--max-size", "1", "--grace", "0s", "--root", root,
                       "--forget-unrecoverable")
    assert "forgot model moved (" in out and "forgot model unpacked (" in out, out
    assert cli(capsys, "path", "moved", "--root", root)[0] == 3


@pytest.mark.parametrize("change", ["moved", "modified", "same size and mtime", "same size and mtime (dir)"])
def test_a_source_changed_after_eviction_is_skipped_with_its_reason(tmp_path: Path, capsys, change: str) -> None:
    root = str(tmp_path / "root")
    if change.endswith("(dir)"):
        top, files = _dir(tmp_path, "m")
        src = top / "model" / "w.bin"
    else:
        src, files = _zip(tmp_path, "m")
        top = src
    assert cli(capsys, "add", str(top), "--root", root, "--progress", "none")[0] == 0
    code, out, _ = cli(capsys, "gc", "--local", "--max-size", "1", "--grace", "0s", "--root", root)
    assert "evicted 2 blob(s)" in out and _missing(Path(root), "m")
    if change == "moved":
        src.rename(tmp_path / "away.carton")
        reason = "the file is gone"
    elif change == "modified":
        src.write_bytes(src.read_bytes() + b"\0")
        reason = "the file changed since it was added"
    else:  # stat cannot tell: the zip's CRC-32 or the blob's sha256 does
        st = src.stat()
        data = bytearray(src.read_bytes())
        at = bytes(data).index(files["model/w.bin"][:64])
        data[at:at + 8] = b"\xff" * 8
        src.write_bytes(bytes(data))
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
        reason = "its bytes no longer match the blob" if change.endswith("(dir)") else "CRC-32 mismatch"
    code, _, err = cli(capsys, "path", "m", "--root", root)
    assert code == 3 and reason in err and str(src) in err, err


def test_a_model_directory_of_the_store_is_no_source(tmp_path: Path) -> None:
    """Adding ROOT/models/<hash> (what `path` printed) must not record the
    store's own hardlinks as a source: gc would evict the blob and the
    directory with it, and nothing could bring it back."""
    src, _files = _zip(tmp_path, "self")
    with Store(tmp_path / "root") as store:
        d = store.add(src).digest
        src.unlink()  # the only lasting source is gone
        model = store.materialize(d)
        assert store.add(model).digest == d
        report = store.collect(GcPolicy(max_size=1, grace=0))
        assert report.evicted_blobs == 0 and [m["manifest_sha256"] for m in report.kept_unrecoverable] == [d]
        assert not store.missing_blobs(d)


def test_a_carton_added_again_during_a_collection_is_not_forgotten(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """--forget-unrecoverable plans from a snapshot; a carton added again
    (with a live source) before the plan is applied is no longer unrecoverable."""
    import cartonstore.store.gc.collect as collection

    src, _ = _zip(tmp_path, "again")
    away = tmp_path / "away.carton"
    with Store(tmp_path / "root") as store:
        d = store.add(src).digest
        src.rename(away)
        planned = collection.plan_collection

        def plan_then_add_again(snap, policy) -> Any:
            plan = planned(snap, policy)
            assert d in plan.forgotten
            away.rename(src)
            store.add(src)
            return plan

        monkeypatch.setattr(collection, "plan_collection", plan_then_add_again)
        report = store.collect(GcPolicy(max_size=1, grace=0, forget_unrecoverable=True))
        assert d not in {m["manifest_sha256"] for m in report.forgotten_models}
        assert store.index.carton(d) is not None


def test_blobs_brought_back_from_their_local_file_count_as_read_from_it(tmp_path: Path) -> None:
    """The puller's stats name the local file as their source (bytes and
    blobs under "file"), with nothing received: before, they were in no
    source's count at all."""
    from kit.fetchkit import URLS_ONLY, fast_config

    from cartonstore.fetch.puller import Puller

    carton, files = _zip(tmp_path, "local")
    with Store(tmp_path / "root") as store:
        digest = store.add(carton, name="local").digest
        assert store.collect(GcPolicy(max_size=1, grace=0)).evicted_blobs >= 1
        missing = set(store.info(digest).missing_blobs)

        async def bring_back() -> dict:
            async with Puller(store, fast_config(), sources=URLS_ONLY) as p:
                await p.materialize("local")
                return p.stats.snapshot()

        moved = asyncio.run(bring_back())
        assert not store.info(digest).missing_blobs
    assert moved["source_blobs"]["file"] == len(missing)
    assert moved["source_bytes"]["file"] == sum(len(data) for data in files.values() if sha(data) in missing)
    assert moved["bytes_received"] == 0 and moved["requests"] == 0
