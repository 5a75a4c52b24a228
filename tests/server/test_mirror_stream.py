"""The registry mirror's blobs as they arrive: a real HTTP origin on
127.0.0.1 plays the upstream registry (GET /v2/ and one blob per path),
stalling or corrupting a blob on purpose; callers are plain HTTP clients
of the daemon's mirror listener."""

from __future__ import annotations

import hashlib
import http.client
import os
import threading
from collections.abc import Iterator

import pytest
from kit.daemonkit import DaemonProcess
from kit.origin import Fault, Origin
from kit.registrykit import free_port


@pytest.fixture(scope="module")
def origin() -> Iterator[Origin]:
    with Origin() as o:
        o.put("/v2/", b"{}", content_type="application/json")
        yield o


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, int]]:
    port = free_port()
    config = tmp_path_factory.mktemp("cfg") / "config.toml"
    # A stalled upstream body is given up on after three seconds and resumed by Range.
    config.write_text('[fetch]\nstall_timeout = "3s"\n')
    daemon = DaemonProcess(tmp_path_factory.mktemp("node") / "store", env={"CARTONSTORE_CONFIG": ""},
                           extra_args=["--mirror-listen", f"127.0.0.1:{port}", "--config", str(config)])
    with daemon:
        yield daemon, port


def upstream_blob(origin: Origin, repo: str, data: bytes, fault: Fault | None = None) -> tuple[str, str]:
    """``data`` as a blob of ``repo`` upstream; its digest and its path there."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = f"/v2/{repo}/blobs/{digest}"
    origin.put(path, data, fault=fault)
    return digest, path


def mirror_get(port: int, origin: Origin, repo: str, digest: str, method: str = "GET",
               headers: dict | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, f"/v2/{repo}/blobs/{digest}?ns=127.0.0.1:{origin.port}", headers=headers or {})
    return conn, conn.getresponse()


def stored(daemon: DaemonProcess) -> set[str]:
    return {p.name for p in (daemon.root / "blobs").rglob("*") if p.is_file()}


def test_a_blob_reaches_its_callers_while_it_arrives_from_one_upstream_fetch(node, origin: Origin) -> None:
    daemon, port = node
    data = os.urandom(512 << 10)
    # The first upstream answer stops after 128 KiB, until the mirror gives up on it and resumes.
    digest, path = upstream_blob(origin, "slow/blob", data, Fault(stall_at=128 << 10, stall_seconds=None, times=1))
    got: dict[str, bytes] = {}
    upstream_sent_then: dict[str, int] = {}

    def caller(name: str) -> None:
        conn, response = mirror_get(port, origin, "slow/blob", digest)
        try:
            assert response.status == 200
            head = response.read(64 << 10)
            upstream_sent_then[name] = origin.bytes_sent_for(path)
            got[name] = head + response.read()
        finally:
            conn.close()

    callers = [threading.Thread(target=caller, args=(n,)) for n in ("a", "b")]
    for t in callers:
        t.start()
    try:
        conn, ranged = mirror_get(port, origin, "slow/blob", digest, headers={"Range": "bytes=1000-1999"})
        assert ranged.status == 206 and ranged.read() == data[1000:2000]   # waited for the blob, then served
        conn.close()
    finally:
        for t in callers:
            t.join(timeout=60)
    # Each caller had its first bytes while upstream had sent a part of the blob.
    assert upstream_sent_then.keys() == {"a", "b"} and max(upstream_sent_then.values()) < len(data)
    assert got == {"a": data, "b": data}
    whole_fetches = [r for r in origin.requests if r.path == path and r.method == "GET" and r.range is None]
    assert len(whole_fetches) == 1, origin.requests
    assert digest[7:] in stored(daemon)


def test_a_corrupt_upstream_blob_cuts_the_answer_and_stores_nothing(node, origin: Origin) -> None:
    daemon, port = node
    data = os.urandom(256 << 10)
    # Wrong bytes, with a pause mid-way (shorter than the stall timeout) so the answer is under way at the end.
    digest, path = upstream_blob(origin, "bad/blob", data, Fault(wrong_bytes=True, stall_at=128 << 10,
                                                                stall_seconds=2.0))
    before = stored(daemon)
    conn, response = mirror_get(port, origin, "bad/blob", digest)
    try:
        assert response.status == 200   # streamed before the end showed the bytes wrong
        with pytest.raises((http.client.IncompleteRead, ConnectionError)):
            response.read()
    finally:
        conn.close()
    assert stored(daemon) == before
    assert not [p for p in (daemon.root / "tmp").iterdir() if "ingest" in p.name]
    assert origin.count(path) == 1


def test_head_of_a_missing_blob_asks_upstream_head_and_downloads_nothing(node, origin: Origin) -> None:
    daemon, port = node
    data = os.urandom(100_000)
    digest, path = upstream_blob(origin, "head/blob", data)
    conn, response = mirror_get(port, origin, "head/blob", digest, method="HEAD")
    conn.close()
    assert response.status == 200
    assert response.headers["Content-Length"] == str(len(data))
    assert response.headers["Docker-Content-Digest"] == digest
    assert origin.count(path, "GET") == 0 and origin.count(path, "HEAD") == 1
    assert digest[7:] not in stored(daemon)
    missing = "sha256:" + "0" * 64
    conn, response = mirror_get(port, origin, "head/blob", missing, method="HEAD")
    conn.close()
    assert response.status == 404
