"""The daemon's API driven by stock clients: tritonclient (sync and aio) on
the TCP port, aiohttp on the Unix socket. A real `cartonstore serve` process."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, short_dir
from kit.daemonkit import DaemonProcess, call, call_socket, unix_session
from tritonclient.utils import InferenceServerException

from cartonstore.cli.commands import main
from cartonstore.store import Store


@pytest.fixture
def served(daemon: DaemonProcess, capsys) -> DaemonProcess:
    assert main(["add", str(FIXTURE_CARTON), "--name", "fx", "--root", str(daemon.root), "--progress", "none"]) == 0
    capsys.readouterr()
    return daemon


def test_tritonclient_sync_repository_flow(served: DaemonProcess) -> None:
    c = triton.InferenceServerClient(served.host_port)
    assert c.is_server_live() and c.is_server_ready()
    meta = c.get_server_metadata()
    assert meta["name"] == "cartonstore" and "model_repository" in meta["extensions"]
    index = c.get_model_repository_index()
    assert {"name": "fx", "version": FIXTURE_DIGEST, "state": "UNAVAILABLE", "reason": "not loaded"} in index
    assert not c.is_model_ready("fx")
    c.load_model("fx")
    assert c.is_model_ready("fx")
    assert c.is_model_ready("fx", FIXTURE_DIGEST)
    assert not c.is_model_ready("fx", "0" * 64)
    md = c.get_model_metadata("fx")
    assert md["versions"] == [FIXTURE_DIGEST] and md["platform"] == "python"
    assert md["inputs"][0] == {"name": "a", "datatype": "FP32", "shape": [-1]}
    assert {"name": "f", "datatype": "INT32", "shape": [-1, 3, 512, 512]} in md["inputs"]
    assert md["outputs"] == [{"name": "y", "datatype": "UINT32", "shape": [2, 3, 512, 512]}]
    assert c.get_model_metadata("fx", FIXTURE_DIGEST)["name"] == "fx"
    ready = c.get_model_repository_index()
    assert any(r["name"] == "fx" and r["state"] == "READY" for r in ready)
    c.unload_model("fx")
    assert not c.is_model_ready("fx")
    c.close()


def test_tritonclient_load_with_a_file_upload(daemon: DaemonProcess) -> None:
    c = triton.InferenceServerClient(daemon.host_port)
    c.load_model("uploaded", config=json.dumps({"name": "uploaded"}),
                 files={"file:1/model.carton": FIXTURE_CARTON.read_bytes()})
    assert c.is_model_ready("uploaded", FIXTURE_DIGEST)
    with pytest.raises(InferenceServerException, match="carton|zip"):
        c.load_model("junk", config="{}", files={"file:1/model.carton": b"not a zip at all" * 1000})
    assert not c.is_model_ready("junk")
    index = {r["name"]: r for r in c.get_model_repository_index()}
    assert index["junk"]["state"] == "UNAVAILABLE" and "zip" in index["junk"]["reason"]
    c.close()


def test_tritonclient_aio(served: DaemonProcess) -> None:
    async def run() -> None:
        c = triton_aio.InferenceServerClient(served.host_port)
        try:
            assert await c.is_server_live()
            await c.load_model("fx")
            assert await c.is_model_ready("fx")
            md = await c.get_model_metadata("fx")
            assert md["versions"] == [FIXTURE_DIGEST]
            with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
                await c.load_model("nope")
            await c.unload_model("fx")
            assert not await c.is_model_ready("fx")
        finally:
            await c.close()

    asyncio.run(run())


def test_leases_over_the_unix_socket(served: DaemonProcess) -> None:
    status, lease = call(served, "POST", "/v1/leases", data=json.dumps({"model": "fx", "ttl": 30}))
    assert status == 200
    assert lease["manifest_sha256"] == FIXTURE_DIGEST
    assert Path(lease["path"]) == served.root / "models" / FIXTURE_DIGEST
    assert (Path(lease["path"]) / "model" / "main.py").is_file()
    status, renewed = call(served, "POST", f"/v1/leases/{lease['lease']}/renew", data=b'{"ttl": 60}')
    assert status == 200 and renewed["expires_at"] > lease["expires_at"]
    assert call(served, "DELETE", f"/v1/leases/{lease['lease']}")[0] == 200
    status, err = call(served, "DELETE", f"/v1/leases/{lease['lease']}")
    assert status == 404 and "no lease" in err["error"]
    status, err = call(served, "POST", f"/v1/leases/{lease['lease']}/renew")
    assert status == 404


def test_expired_lease_cannot_be_renewed(served: DaemonProcess) -> None:
    import time

    _, lease = call(served, "POST", "/v1/leases", json={"model": FIXTURE_DIGEST[:10], "ttl": 0.2})
    time.sleep(0.4)
    status, err = call(served, "POST", f"/v1/leases/{lease['lease']}/renew", json={"ttl": 5})
    assert status == 404 and "expired" in err["error"]


BAD_REQUESTS = [
    ("POST", "/v1/leases", {"data": b"{not json"}, 400, "not valid JSON"),
    ("POST", "/v1/leases", {"data": b"[1, 2]"}, 400, "JSON object"),
    ("POST", "/v1/leases", {"json": {"ttl": 5}}, 400, "'model'"),
    ("POST", "/v1/leases", {"json": {"model": 7}}, 400, "'model'"),
    ("POST", "/v1/leases", {"json": {"model": "fx", "ttl": "soon"}}, 400, "ttl"),
    ("POST", "/v1/leases", {"json": {"model": "fx", "ttl": -1}}, 400, "ttl"),
    ("POST", "/v1/leases", {"json": {"model": "fx", "ttl": 10**9}}, 400, "ttl"),
    ("POST", "/v1/leases", {"json": {"model": "no-such-model"}}, 404, "no carton matches"),
    ("POST", "/v1/leases", {"json": {"model": "fx", "holder": 5}}, 400, "holder"),
    ("POST", "/v2/repository/models/nope/load", {}, 404, "unknown model 'nope'"),
    ("POST", "/v2/repository/models/x/load", {"json": {"parameters": []}}, 400, "'parameters' must be an object"),
    ("POST", "/v2/repository/models/x/load", {"json": {"parameters": {"source": 5}}}, 400, "'source' must be a string"),
    ("POST", "/v2/repository/models/x/load", {"json": {"parameters": {"source": "ftp://h/m.carton"}}}, 400,
     "'ftp' is not allowed"),
    ("POST", "/v2/repository/models/x/load", {"json": {"parameters": {"source": "file:///etc/passwd"}}}, 400,
     "'file' is not allowed"),
    ("POST", "/v2/repository/models/x/load", {"json": {"parameters": {"config": "{oops"}}}, 400, "'config'"),
    ("POST", "/v2/repository/models/x/load", {"json": {"parameters": {"file:1/model.carton": "@@@"}}}, 400, "base64"),
    ("POST", "/v2/repository/models/x/load",
     {"json": {"parameters": {"file:1/../../etc/x": base64.b64encode(b"x").decode()}}}, 400, r"\.\."),
    ("POST", "/v2/repository/index", {"json": {"ready": "yes"}}, 400, "'ready' must be a boolean"),
    ("POST", "/v2/repository/models/nope/unload", {}, 404, "unknown model"),
    ("GET", "/v2/models/nope", {}, 404, "unknown model"),
    ("GET", f"/v2/models/fx/versions/{'0' * 64}", {}, 404, "Request for unknown model: 'fx' version 0{64} is not found"),
    ("GET", "/v2/models/fx/ready", {}, 400, "not ready"),
    ("POST", "/v1/leases/pin:fx/renew", {}, 404, "no lease"),
    ("DELETE", "/v1/leases/pin:fx", {}, 400, "unloading"),
    ("GET", "/v1/blobs/xyz", {}, 400, "sha256"),
    ("GET", f"/v1/blobs/{'0' * 64}", {}, 404, "not in this store"),
    ("GET", "/v3/nothing", {}, 404, "no such endpoint"),
]


@pytest.fixture(scope="module")
def shared_daemon() -> Iterator[DaemonProcess]:
    """One daemon for the requests that change nothing."""
    with short_dir() as base, DaemonProcess(base / "root") as d:
        assert main(["add", str(FIXTURE_CARTON), "--name", "fx", "--root", str(d.root), "--progress", "none"]) == 0
        yield d


@pytest.mark.parametrize("method,path,kw,status,pattern", BAD_REQUESTS)
def test_bad_requests_get_clear_errors(shared_daemon: DaemonProcess, method, path, kw, status, pattern) -> None:
    import re

    got, body = call(shared_daemon, method, path, **kw)
    assert got == status, body
    assert isinstance(body, dict) and re.search(pattern, body["error"]), body


def test_empty_bodies_and_no_content_type(served: DaemonProcess) -> None:
    assert call(served, "POST", "/v2/repository/index", data=b"")[0] == 200
    status, _ = call(served, "POST", "/v2/repository/models/fx/load", data=b"",
                     headers={"Content-Type": "application/x-whatever"})
    assert status == 200
    assert call(served, "POST", "/v2/repository/models/fx/unload")[0] == 200


def test_load_by_source_url_and_path(daemon: DaemonProcess, origin) -> None:
    origin.put("/m.carton", FIXTURE_CARTON.read_bytes())
    status, _ = call(daemon, "POST", "/v2/repository/models/byurl/load",
                     json={"parameters": {"source": origin.url("/m.carton")}})
    assert status == 200
    status, _ = call(daemon, "POST", "/v2/repository/models/bypath/load",
                     json={"parameters": {"source": str(FIXTURE_CARTON)}})
    assert status == 200
    _, index = call(daemon, "POST", "/v2/repository/index", json={"ready": True})
    assert {r["name"] for r in index} == {"byurl", "bypath"}
    _, text = call(daemon, "GET", "/metrics")
    saved = next(float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("cartonstore_dedup_saved_bytes_total"))
    assert saved > 1_000_000, "the second load of the same carton stored nothing new"


def test_concurrent_leases_share_one_fetch(daemon: DaemonProcess, tmp_path: Path, origin) -> None:
    import os

    from kit.fetchkit import linked_carton
    from kit.origin import Fault

    blobs = {f"model/{i}.bin": os.urandom(100_000) for i in range(3)}
    carton, shas = linked_carton(tmp_path, origin, blobs)
    for d in shas.values():
        origin.set_fault(f"/blobs/{d}", Fault(delay=0.3))
    assert main(["add", str(carton), "--lazy", "--name", "lazy", "--root", str(daemon.root),
                 "--progress", "none"]) == 0

    async def many() -> list:
        return await asyncio.gather(*(call_socket(daemon.socket_path, "POST", "/v1/leases", json={"model": "lazy"})
                                      for _ in range(16)))

    results = asyncio.run(many())
    assert all(status == 200 for status, _ in results), results
    assert len({body["path"] for _, body in results}) == 1
    for d in shas.values():
        assert origin.count(f"/blobs/{d}") == 1


def test_blobs_for_peers(served: DaemonProcess) -> None:
    import zlib

    import zstandard

    from cartonstore.store import Store

    with Store(served.root) as s:
        entry = next(e for e in s.index.entries(FIXTURE_DIGEST) if e.path == "misc/model_architecture.png")
        data = s.blobs.path(entry.digest).read_bytes()
    path = f"/v1/blobs/{entry.digest}"

    async def fetch(headers: dict) -> tuple[int, dict, bytes]:
        async with unix_session(served.socket_path) as sess, sess.get(path, headers=headers, auto_decompress=False) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read()

    status, headers, body = asyncio.run(fetch({"Accept-Encoding": "identity"}))
    assert status == 200 and body == data and headers["etag"]
    status, headers, body = asyncio.run(fetch({"Range": "bytes=100-199"}))
    assert status == 206 and body == data[100:200] and headers["content-range"] == f"bytes 100-199/{len(data)}"
    status, headers, body = asyncio.run(fetch({"Accept-Encoding": "zstd, gzip"}))
    assert headers["content-encoding"] == "zstd"
    assert zstandard.ZstdDecompressor().decompressobj().decompress(body) == data
    status, headers, body = asyncio.run(fetch({"Accept-Encoding": "gzip;q=1, zstd;q=0"}))
    assert headers["content-encoding"] == "gzip" and zlib.decompress(body, 16 + zlib.MAX_WBITS) == data


def test_daemon_as_a_mirror_for_another_store(served: DaemonProcess, tmp_path: Path) -> None:
    """A second node lists this daemon's /v1/blobs as a mirror."""
    from kit.fetchkit import fast_config, pull

    from cartonstore.store import Store

    # A thin copy of the fixture: every file linked to a URL that is gone.
    with Store(served.root) as s:
        s.export("fx", tmp_path / "thin.carton", link_prefix="http://127.0.0.1:9/gone", link_min_size=1)
    with Store(tmp_path / "node2") as other:
        r = pull(other, str(tmp_path / "thin.carton"), fast_config(mirrors=(served.http_url + "/v1/blobs",)))
        assert r.complete and r.digest == FIXTURE_DIGEST
        assert other.verify().ok


def test_metrics(served: DaemonProcess) -> None:
    call(served, "POST", "/v1/leases", json={"model": "fx"})
    call(served, "POST", "/v1/leases", json={"model": "fx"})
    status, text = call(served, "GET", "/metrics")
    assert status == 200
    assert 'cartonstore_http_requests_total{method="POST",route="/v1/leases",status="200"} 2.0' in text
    assert "cartonstore_cache_misses_total 1.0" in text and "cartonstore_cache_hits_total 1.0" in text
    assert "cartonstore_leases 2.0" in text
    assert "cartonstore_store_bytes" in text and "_created" not in text


def test_a_loaded_models_pin_is_neither_renewed_nor_released_by_a_client(served: DaemonProcess) -> None:
    """A short ttl on a pin would let gc take the files a runner serves."""
    assert call(served, "POST", "/v2/repository/models/fx/load")[0] == 200
    with Store(served.root) as store:
        pin = next(lease.id for lease in store.index.live_leases(FIXTURE_DIGEST) if lease.id.startswith("pin:"))
    status, err = call(served, "POST", f"/v1/leases/{pin}/renew", json={"ttl": 1})
    assert status == 400 and "a daemon's own" in err["error"]
    status, err = call(served, "DELETE", f"/v1/leases/{pin}")
    assert status == 400 and "unloading" in err["error"]
    with Store(served.root) as store:
        assert store.index.live_leases(FIXTURE_DIGEST)[0].expires_at > time.time() + 30
    assert call(served, "POST", "/v2/repository/models/fx/unload")[0] == 200


def test_a_load_with_a_bad_name_leaves_nothing_behind(served: DaemonProcess) -> None:
    status, err = call(served, "POST", "/v2/repository/models/bad%20name/load",
                       json={"parameters": {"source": str(FIXTURE_CARTON)}})
    assert status == 400 and "invalid name" in err["error"]
    status, index = call(served, "POST", "/v2/repository/index")
    assert "bad name" not in {row["name"] for row in index}
