"""GET /v1/node and the node's /metrics series: what the store holds model
by model (cached, partial, leased, loaded), bytes served, hit ratios by
source, and whether the last gc with a budget met it, as a `cartonstore gc`
run by hand and the daemon's own collections both record it."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
from conftest import carton_entries, write_zip

from cartonstore.cli.commands import main

TOML = b'spec_version = 1\nmodel_name = "%s"\n[runner]\nrunner_name = "tensorflow"\nrequired_framework_version = "*"\n'
SHARED = os.urandom(40_000)   # the weights "remote" shares with "kept": its URL add reuses them


def _carton(dest: Path, name: str, weights: bytes) -> Path:
    files = {"carton.toml": TOML % name.encode(), "model/w.bin": weights}
    return write_zip(dest / f"{name}.carton", carton_entries(files))


def _cli(*argv: str) -> None:
    assert main([*argv]) == 0


def _series(text: str, metric: str, **labels: str) -> float:
    """The value of the one series of ``metric`` with these labels."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))   # as prometheus_client writes them
    found = re.findall(rf"^{metric}\{{{re.escape(want)}\}} (\S+)$" if labels else rf"^{metric} (\S+)$", text, re.M)
    assert len(found) == 1, (metric, labels, found)
    return float(found[0])


def _by_name(node: dict) -> dict[str, dict]:
    return {",".join(m["names"]): m for m in node["models"]}


@pytest.mark.slow
def test_the_node_tells_what_it_holds_and_when_it_is_full(short_tmp: Path, origin) -> None:
    from kit.daemonkit import DaemonProcess, call

    root, src = short_tmp / "root", short_tmp / "src"
    src.mkdir()
    common = ("--root", str(root), "--progress", "none")
    _cli("add", str(_carton(src, "lazy", os.urandom(30_000))), "--name", "lazy", *common)
    # by hand, before any daemon: lazy loses its weights (its zip brings them back) and the store stays
    # over a 1-byte budget, held there by what keeps it known
    _cli("gc", "--max-size", "1", "--grace", "0s", "--root", str(root))
    for name in ("kept", "leased", "loaded"):
        _cli("add", str(_carton(src, name, SHARED if name == "kept" else os.urandom(20_000))), "--name", name,
             *common)
    origin.put("/remote.carton", _carton(src, "remote", SHARED).read_bytes())
    _cli("add", origin.url("/remote.carton"), "--name", "remote", *common)

    with DaemonProcess(root, listen=None) as d:
        status, node = call(d, "GET", "/v1/node")
        assert status == 200, node
        assert node["over_budget"] is True, "the CLI's gc is the store's: the daemon reads it"
        assert node["over_budget_reason"]["setting"] == "max_size" and node["over_budget_reason"]["held"] == []

        status, lease = call(d, "POST", "/v1/leases", json={"model": "leased", "ttl": 600})
        assert status == 200, lease
        status, body = call(d, "POST", "/v2/repository/models/loaded/load", json={})
        assert status == 200, body
        status, node = call(d, "GET", "/v1/node")
        models = _by_name(node)
        assert {n: m["state"] for n, m in models.items()} == {
            "lazy": "partial", "kept": "cached", "leased": "cached", "loaded": "cached", "remote": "cached"}
        assert models["lazy"]["missing_blobs"] == 1
        assert (models["leased"]["leases"], models["leased"]["loaded_as"]) == (1, [])
        assert (models["loaded"]["leases"], models["loaded"]["loaded_as"]) == (0, ["loaded"])
        assert models["kept"]["size"] > 40_000 and node["store"]["bytes"] > 0
        assert node["store"]["filesystem_free"] > 0 and node["budget"]["max_size"] is None
        url = next(s for s in node["sources"] if s["kind"] == "url")
        assert url["reused_bytes"] >= len(SHARED), url
        assert url["hit_ratio"] == url["reused_bytes"] / (url["reused_bytes"] + url["fetched_bytes"])

        status, metrics = call(d, "GET", "/metrics")
        for name, m in models.items():
            key = {"model": name, "digest": m["manifest_sha256"][:12]}
            assert _series(metrics, "cartonstore_model_cached", **key) == (m["state"] == "cached")
            assert _series(metrics, "cartonstore_model_partial", **key) == (m["state"] == "partial")
            assert _series(metrics, "cartonstore_model_leases", **key) == m["leases"]
            assert _series(metrics, "cartonstore_model_loaded", **key) == len(m["loaded_as"])
        assert _series(metrics, "cartonstore_source_hit_ratio", kind="url") == pytest.approx(url["hit_ratio"])
        assert _series(metrics, "cartonstore_store_over_budget") == 1

        assert asyncio.run(_read_blob(d.socket_path, _blob_of(root, models["kept"]["manifest_sha256"]))) == SHARED
        _, node = call(d, "GET", "/v1/node")
        assert node["served_bytes"] == {"blobs": len(SHARED), "mirror": 0}
        _, metrics = call(d, "GET", "/metrics")
        assert _series(metrics, "cartonstore_served_bytes_total", kind="blobs") == len(SHARED)

        # the daemon's gc, under a budget below what is leased and loaded
        status, report = call(d, "POST", "/v1/gc", json={"max_size": 1, "grace": 0})
        assert status == 200 and report["over_budget"], report
        _, node = call(d, "GET", "/v1/node")
        assert node["over_budget"] is True
        held = {",".join(h["names"]): h for h in node["over_budget_reason"]["held"]}
        assert set(held) == {"leased", "loaded"} and held["loaded"]["loaded_as"] == ["loaded"]
        assert any("gc never takes what is loaded or leased" in line for line in node["over_budget_reason"]["lines"])
        assert _by_name(node)["kept"]["state"] == "partial", "what nothing holds was evicted"
        _, metrics = call(d, "GET", "/metrics")
        assert _series(metrics, "cartonstore_store_over_budget") == 1

        status, report = call(d, "POST", "/v1/gc", json={"max_size": 1 << 40, "grace": 0})
        assert status == 200 and report["over_budget"] is None, report
        _, node = call(d, "GET", "/v1/node")
        assert node["over_budget"] is False and node["over_budget_reason"] is None
        _, metrics = call(d, "GET", "/metrics")
        assert _series(metrics, "cartonstore_store_over_budget") == 0

        status, node = call(d, "POST", "/v1/gc", json={"dry_run": True, "max_size": 1, "grace": 0})
        assert status == 200
        assert call(d, "GET", "/v1/node")[1]["over_budget"] is False, "a dry run records nothing"


async def _read_blob(socket: Path, digest: str) -> bytes:
    from kit.daemonkit import unix_session

    async with unix_session(socket) as s, s.get(f"/v1/blobs/{digest}") as r:
        assert r.status == 200, await r.text()
        return await r.read()


def _blob_of(root: Path, digest: str) -> str:
    """The weights' blob of a carton, from its model directory's MANIFEST."""
    from cartonstore.store import Store

    with Store(root) as s:
        return next(e.digest for e in s.index.entries(digest) if e.path == "model/w.bin")
