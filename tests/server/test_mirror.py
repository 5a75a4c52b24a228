"""The daemon's pull-through registry mirror, with the real registry as
upstream and skopeo pulling through it."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.daemonkit import DaemonProcess, call
from kit.registrykit import Registry, free_port, needs_registry

pytestmark = [needs_registry, pytest.mark.skipif(shutil.which("skopeo") is None, reason="skopeo is not installed")]


def small_image(registry: Registry, repo: str, tag: str) -> dict[str, bytes]:
    """A one-layer image pushed to ``registry``; its blobs by hex digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"hello from the mirror\n" * 1000
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    layer = gzip.compress(buf.getvalue())
    diff_id = "sha256:" + hashlib.sha256(buf.getvalue()).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers",
                         "diff_ids": [diff_id]}, "config": {}}).encode()
    blobs = {registry.put_blob(repo, b): b for b in (config, layer)}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": "sha256:" + hashlib.sha256(config).hexdigest(), "size": len(config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": "sha256:" + hashlib.sha256(layer).hexdigest(), "size": len(layer)}]}
    registry.put_manifest(repo, tag, json.dumps(manifest).encode())
    return blobs


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with Registry(tmp_path_factory.mktemp("upstream")) as registry:
        yield registry


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory, upstream: Registry) -> Iterator[tuple[DaemonProcess, str]]:
    port = free_port()
    daemon = DaemonProcess(tmp_path_factory.mktemp("node") / "store",
                           extra_args=["--mirror-listen", f"127.0.0.1:{port}"],
                           env={"CARTONSTORE_CONFIG": ""})
    config = tmp_path_factory.mktemp("cfg") / "config.toml"
    config.write_text(f'[mirror]\nupstream = "{upstream.authority}"\n')
    daemon.extra_args += ["--config", str(config)]
    with daemon:
        yield daemon, f"127.0.0.1:{port}"


def skopeo_copy(mirror: str, ref: str, dest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["skopeo", "copy", "--src-tls-verify=false", f"docker://{mirror}/{ref}", f"oci:{dest}"],
                          capture_output=True, text=True, timeout=120)


def mirror_call(mirror: str, method: str, path: str) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{mirror}{path}", method=method, data=b"" if method != "GET" else None)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, {}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_pull_through_then_from_the_store_with_upstream_stopped(mirror, upstream: Registry, tmp_path: Path) -> None:
    daemon, address = mirror
    blobs = small_image(upstream, "apps/hello", "v1")
    first = skopeo_copy(address, "apps/hello:v1", tmp_path / "first")
    assert first.returncode == 0, first.stderr
    for digest, data in blobs.items():
        assert (tmp_path / "first" / "blobs" / "sha256" / digest).read_bytes() == data
    upstream.stop()
    try:
        second = skopeo_copy(address, "apps/hello:v1", tmp_path / "second")
        assert second.returncode == 0, second.stderr
        for digest, data in blobs.items():
            assert (tmp_path / "second" / "blobs" / "sha256" / digest).read_bytes() == data
    finally:
        upstream.start()
    _, metrics = call(daemon, "GET", "/metrics")
    served = re.search(r'^cartonstore_served_bytes_total\{kind="mirror"\} (\S+)$', str(metrics), re.M)
    assert served is not None and float(served[1]) >= 2 * sum(len(data) for data in blobs.values())


def test_push_routes_are_405_and_unknown_manifests_manifest_unknown(mirror) -> None:
    _daemon, address = mirror
    for method, path in (("POST", "/v2/apps/hello/blobs/uploads/"), ("PUT", "/v2/apps/hello/manifests/v1"),
                         ("PATCH", "/v2/apps/hello/blobs/uploads/x"), ("DELETE", "/v2/apps/hello/manifests/v1")):
        status, body = mirror_call(address, method, path)
        assert status == 405 and body["errors"][0]["code"] == "UNSUPPORTED", (method, path, body)
    status, body = mirror_call(address, "GET", "/v2/apps/nothing-here/manifests/v9")
    assert status == 404 and body["errors"][0]["code"] == "MANIFEST_UNKNOWN", body
