"""A carton of model files no runner serves (safetensors, GGUF, a
tokenizer) is a store entry like any other: added as a directory with its
generated carton.toml, listed, inspected (formats, safetensors headers,
GGUF metadata), materialized, exported and added again to the same digest,
evicted by a gc budget and fetched again from its recorded source, leased
from a daemon that loads it as files only and says why it cannot run it,
and fetched by another node from this one."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest
from kit.daemonkit import DaemonProcess, unix_session
from kit.modelfiles import gguf_file, safetensors_file

from cartonstore.carton.from_files import ListedFile, files_carton
from cartonstore.cli.commands import main
from cartonstore.store import Store

NO_RUNNER = "no runner serves safetensors; lease it with `cartonstore path` or POST /v1/leases"


def model_files(tmp_path: Path) -> dict[str, Path]:
    """A repository as a transformers user keeps it, and a GGUF beside it."""
    src = tmp_path / "files"
    src.mkdir()
    (src / "tokenizer.json").write_text('{"version": "1.0"}')
    return {"model.safetensors": safetensors_file(src / "model.safetensors", {
                "embed.weight": ("F16", (64, 256)), "norm.weight": ("F32", (256,)), "lm_head.weight": ("F16", (64, 256))}),
            "gguf/tiny-Q4_K_M.gguf": gguf_file(tmp_path / "tiny.gguf", file_type=15),
            "tokenizer.json": src / "tokenizer.json"}


def carton_dir(tmp_path: Path, files: dict[str, Path]) -> tuple[Path, str]:
    """The files as from_files places them, with its carton.toml; and its manifest digest."""
    listed = {p: ListedFile(hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_size) for p, f in files.items()}
    carton = files_carton("org/tiny", listed, origin="test")
    root = tmp_path / "carton"
    for path, f in files.items():
        (root / "model" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "model" / path).write_bytes(f.read_bytes())
    (root / "carton.toml").write_bytes(carton.small["carton.toml"])
    return root, hashlib.sha256(carton.small["MANIFEST"]).hexdigest()


def cli(capsys, *argv: str) -> str:
    capsys.readouterr()
    code = main([*argv])
    captured = capsys.readouterr()
    assert code == 0, (argv, captured.err)
    return captured.out


def test_every_store_operation_on_a_carton_of_files(tmp_path: Path, capsys) -> None:
    files = model_files(tmp_path)
    src, digest = carton_dir(tmp_path, files)
    root = str(tmp_path / "root")
    assert cli(capsys, "add", str(src), "--name", "tiny", "--root", root).split()[-1] == digest
    assert [row["names"] for row in json.loads(cli(capsys, "ls", "--root", root, "--json"))] == [["tiny"]]

    doc = json.loads(cli(capsys, "inspect", "tiny", "--root", root, "--json"))
    assert doc["runner"]["runner_name"] == "safetensors"
    described = {f["path"]: f for f in doc["model_files"]}
    assert {p: (f["format"], f["size"]) for p, f in described.items()} == {
        "model/model.safetensors": ("safetensors", files["model.safetensors"].stat().st_size),
        "model/gguf/tiny-Q4_K_M.gguf": ("gguf", files["gguf/tiny-Q4_K_M.gguf"].stat().st_size),
        "model/tokenizer.json": (None, 18)}
    assert described["model/model.safetensors"]["header"] == {
        "tensors": 3, "parameters": 2 * 64 * 256 + 256, "dtypes": {"F16": 2, "F32": 1}}
    gguf = described["model/gguf/tiny-Q4_K_M.gguf"]["header"]
    assert (gguf["architecture"], gguf["name"], gguf["quantization"], gguf["context_length"], gguf["parameters"]) \
        == ("llama", "Tiny Llama", "Q4_K_M", 4096, 8 * 16 + 8)
    text = cli(capsys, "inspect", "tiny", "--root", root)
    assert "3 tensors, 33K parameters, F16 x2 F32 x1" in text
    assert "llama 'Tiny Llama', quantization Q4_K_M, context 4096" in text
    alone = json.loads(cli(capsys, "inspect", str(files["gguf/tiny-Q4_K_M.gguf"]), "--root", root, "--json"))
    assert alone["format"] == "gguf" and alone["header"] == gguf

    model = Path(cli(capsys, "path", "tiny", "--root", root).split()[-1])
    assert (model / "model" / "gguf" / "tiny-Q4_K_M.gguf").read_bytes() == files["gguf/tiny-Q4_K_M.gguf"].read_bytes()

    exported = tmp_path / "tiny.carton"
    cli(capsys, "export", "tiny", "-o", str(exported), "--root", root)
    assert cli(capsys, "add", str(exported), "--name", "again", "--root", str(tmp_path / "other")).split()[-1] == digest

    report = json.loads(cli(capsys, "gc", "--max-size", "1", "--grace", "0s", "--root", root, "--json"))
    assert report["kept_unrecoverable"] == []
    with Store(Path(root)) as s:
        assert len(s.info(digest).missing_blobs) == 3, "every model file evicted"
    model = Path(cli(capsys, "path", "tiny", "--root", root).split()[-1])   # fetched again from the directory
    assert (model / "model" / "model.safetensors").read_bytes() == files["model.safetensors"].read_bytes()
    with Store(Path(root)) as s:
        assert not s.info(digest).missing_blobs and s.verify().ok


def test_a_daemon_leases_it_and_loads_it_as_files_only_naming_why(daemon: DaemonProcess, tmp_path: Path,
                                                                    capsys) -> None:
    src, digest = carton_dir(tmp_path, model_files(tmp_path))
    cli(capsys, "add", str(src), "--name", "tiny", "--root", str(daemon.root))

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            async with s.post("/v1/leases", json={"model": "tiny", "ttl": 30}) as r:
                assert r.status == 200, await r.text()
                lease = await r.json()
            assert lease["manifest_sha256"] == digest and (Path(lease["path"]) / "model" / "model.safetensors").is_file()
            async with s.post("/v2/repository/models/tiny/load", json={}) as r:
                assert r.status == 200 and await r.json() == {"reason": f"loaded as files only: {NO_RUNNER}"}
            async with s.post("/v2/repository/index", json={}) as r:
                row = next(m for m in await r.json() if m["name"] == "tiny")
            assert row["state"] == "READY" and NO_RUNNER in row["reason"]
            async with s.post("/v2/models/tiny/infer", json={"inputs": []}) as r:
                assert r.status == 400 and NO_RUNNER in (await r.json())["error"]
    asyncio.run(go())
    out = cli(capsys, "load", "tiny", "--socket", str(daemon.socket_path))
    assert out.startswith(f"loaded tiny: version {digest[:12]} is ready (loaded as files only: {NO_RUNNER})")


@pytest.mark.slow
def test_another_node_fetches_it_from_this_one(tmp_path: Path, capsys) -> None:
    from conftest import short_dir
    from kit.origin import Origin
    from kit.peerkit import fleet, metric

    from cartonstore.client.leases import Client

    files = model_files(tmp_path)
    src, digest = carton_dir(tmp_path, files)
    root = str(tmp_path / "root")
    cli(capsys, "add", str(src), "--root", root)
    cli(capsys, "export", digest, "-o", str(tmp_path / "tiny.carton"), "--root", root)
    weights = files["model.safetensors"].read_bytes()
    with Origin() as origin, short_dir() as base:
        origin.put_file("/tiny.carton", tmp_path / "tiny.carton")
        with fleet(base, 2) as nodes:
            Client(nodes[0].socket_path, timeout=60).acquire(origin.url("/tiny.carton"), ttl=600)
            lease = Client(nodes[1].socket_path, timeout=60).acquire(origin.url("/tiny.carton"), ttl=600)
            assert lease.manifest_sha256 == digest
            assert (lease.path / "model" / "model.safetensors").read_bytes() == weights
            assert metric(nodes[1], "cartonstore_fetched_source_bytes_total", 'source="peer"') >= len(weights)
