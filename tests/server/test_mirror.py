"""The daemon's pull-through registry mirror, with the real registry as
upstream (its access log counting what was fetched from it), and skopeo
and containerd pulling through it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit import modelkit_oci
from kit.containerdkit import Containerd, needs_containerd
from kit.daemonkit import DaemonProcess, call, wait_for
from kit.prockit import live_pids
from kit.registrykit import Registry, free_port, needs_registry, push_small_image

pytestmark = [needs_registry]
needs_skopeo = pytest.mark.skipif(shutil.which("skopeo") is None, reason="skopeo is not installed")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with Registry(tmp_path_factory.mktemp("upstream"), access_log=True) as registry:
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


@needs_skopeo
def test_pull_through_then_from_the_store_with_upstream_stopped(mirror, upstream: Registry, tmp_path: Path) -> None:
    daemon, address = mirror
    blobs = push_small_image(upstream, "apps/hello", "v1")
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
    gets = upstream.blob_gets()
    assert {digest: gets[digest] for digest in blobs} == dict.fromkeys(blobs, 1)   # each fetched upstream once


@needs_containerd
def test_containerd_pulls_an_image_and_a_model_through_the_mirror(mirror, upstream: Registry) -> None:
    """ctr pulls (with a hosts.toml naming the mirror) a container image and
    fetches a model artifact (ctr's unpack takes only container layers);
    both again, after the content is gone from containerd, with upstream
    stopped."""
    _daemon, address = mirror
    blobs = push_small_image(upstream, "apps/ctr", "v1", text=b"hello, containerd\n")
    model = modelkit_oci.modelpack({"model.safetensors": bytes(range(256)) * 2048})
    modelkit_oci.push(upstream, "models/ctr", "v1", model)
    blobs.update({modelkit_oci.sha(data): data for data in model.blobs})
    image, artifact = f"{upstream.authority}/apps/ctr:v1", f"{upstream.authority}/models/ctr:v1"
    with Containerd() as containerd:
        containerd.mirror(upstream.authority, address)
        hosts = ("--hosts-dir", str(containerd.hosts_dir))

        def pull_both() -> None:
            pulled = containerd.ctr("images", "pull", "--snapshotter", "native", *hosts, image)
            assert pulled.returncode == 0, pulled.stderr + containerd.read_log()[-2000:]
            fetched = containerd.ctr("content", "fetch", *hosts, artifact)
            assert fetched.returncode == 0, fetched.stderr + containerd.read_log()[-2000:]
            held = containerd.ctr("content", "ls", "-q").stdout.split()
            assert {f"sha256:{digest}" for digest in blobs} <= set(held)

        pull_both()
        for ref in (image, artifact):   # gone from containerd: the next pull fetches every blob again
            assert containerd.ctr("images", "rm", "--sync", ref).returncode == 0
        assert not {f"sha256:{digest}" for digest in blobs} & set(containerd.ctr("content", "ls", "-q").stdout.split())
        upstream.stop()
        try:
            pull_both()
        finally:
            upstream.start()
    assert not live_pids(str(containerd.workdir)), "containerd left running"
    gets = upstream.blob_gets()
    assert {digest: gets[digest] for digest in blobs} == dict.fromkeys(blobs, 1)   # each fetched upstream once


def test_push_routes_are_405_and_unknown_manifests_manifest_unknown(mirror) -> None:
    _daemon, address = mirror
    for method, path in (("POST", "/v2/apps/hello/blobs/uploads/"), ("PUT", "/v2/apps/hello/manifests/v1"),
                         ("PATCH", "/v2/apps/hello/blobs/uploads/x"), ("DELETE", "/v2/apps/hello/manifests/v1")):
        status, body = mirror_call(address, method, path)
        assert status == 405 and body["errors"][0]["code"] == "UNSUPPORTED", (method, path, body)
    status, body = mirror_call(address, "GET", "/v2/apps/nothing-here/manifests/v9")
    assert status == 404 and body["errors"][0]["code"] == "MANIFEST_UNKNOWN", body


@needs_skopeo
def test_a_blob_that_is_no_manifest_is_never_answered_as_one(mirror, upstream: Registry, tmp_path: Path) -> None:
    """A config or a layer the node holds, asked for as a manifest by its
    digest: not read and answered as a manifest (the big one not read
    whole), but asked of upstream: Debian's docker-registry answers such a
    GET 500, which the mirror passes on as 502 naming it (a registry may
    answer 404 MANIFEST_UNKNOWN)."""
    daemon, address = mirror
    blobs = push_small_image(upstream, "apps/blobs", "v1", text=b"not a manifest\n")
    pulled = skopeo_copy(address, "apps/blobs:v1", tmp_path / "pulled")
    assert pulled.returncode == 0, pulled.stderr
    assert wait_for(lambda: all(list(daemon.root.rglob(digest)) for digest in blobs), 30)   # the node holds them
    for digest in blobs:
        status, body = mirror_call(address, "GET", f"/v2/apps/blobs/manifests/sha256:{digest}")
        upstream_said = (status == 404 and body["errors"][0]["code"] == "MANIFEST_UNKNOWN") or \
            (status == 502 and "the registry answered HTTP 500" in body["errors"][0]["message"])
        assert upstream_said, (digest, status, body)
