"""A real CNCF distribution registry (Debian's docker-registry) on 127.0.0.1,
with a temp storage directory, and optionally htpasswd (Basic) auth.

Tests that need one skip, saying why, where the binary is missing.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kit.prockit import stop_process

BINARY = shutil.which("docker-registry") or shutil.which("registry")
USER, PASSWORD = "alice", "s3cret"
# bcrypt of PASSWORD (htpasswd -B): distribution reads bcrypt entries only.
HTPASSWD = f"{USER}:$2y$05$vrOEt6tb8vXi1OLPUMeFd.8fzg8Y9YG4kphdPtIMaFr4DQ7r32dN6\n"

needs_registry = pytest.mark.skipif(BINARY is None, reason="docker-registry (Debian package docker-registry) is "
                                                          "not installed; .ci/run installs it")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    def __init__(self, workdir: Path, *, htpasswd: bool = False, tls: tuple[Path, Path] | None = None,
                 access_log: bool = False) -> None:
        """access_log: it logs every request it answers (blob_gets reads them)."""
        self.workdir = workdir
        self.port = free_port()
        self.htpasswd = htpasswd
        self.tls = tls
        self.access_log = access_log
        self.proc: subprocess.Popen | None = None

    @property
    def authority(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ref(self, repo_and_tag: str) -> str:
        return f"oci://{self.authority}/{repo_and_tag}"

    def start(self) -> Registry:
        assert BINARY is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = [
            "version: 0.1", "log:", "  level: error", "  accesslog:", f"    disabled: {str(not self.access_log).lower()}",
            "storage:", "  filesystem:", f"    rootdirectory: {self.workdir / 'data'}", "  delete:", "    enabled: true",
            "http:", f"  addr: 127.0.0.1:{self.port}",
        ]
        if self.tls:
            config += ["  tls:", f"    certificate: {self.tls[0]}", f"    key: {self.tls[1]}"]
        if self.htpasswd:
            (self.workdir / "htpasswd").write_text(HTPASSWD)
            config += ["auth:", "  htpasswd:", "    realm: test-registry", f"    path: {self.workdir / 'htpasswd'}"]
        (self.workdir / "config.yml").write_text("\n".join(config) + "\n")
        # appended to across restarts: the access log counts them all
        self.log = open(self.workdir / "registry.log", "ab")  # noqa: SIM115 - the registry's stdout, closed by stop()
        self.proc = subprocess.Popen([BINARY, "serve", str(self.workdir / "config.yml")], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        scheme = "https" if self.tls else "http"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {(self.workdir / 'registry.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"docker-registry did not listen on {self.port} ({scheme})")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.log.close()
        self.proc = None

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reading the registry directly, as a second client would ----------------------

    def _open(self, method: str, path: str, data: bytes | None = None, headers: dict | None = None) -> Any:
        request = urllib.request.Request(f"http://{self.authority}{path}", data=data, method=method,
                                         headers=headers or {})
        if self.htpasswd:
            import base64

            request.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
        return urllib.request.urlopen(request, timeout=10)

    def has_blob(self, repo: str, digest: str) -> bool:
        try:
            with self._open("HEAD", f"/v2/{repo}/blobs/sha256:{digest}"):
                return True
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise

    def manifest(self, repo: str, ref: str) -> bytes:
        with self._open("GET", f"/v2/{repo}/manifests/{ref}",
                        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}) as r:
            return r.read()

    def blob(self, repo: str, digest: str) -> bytes:
        """A blob's bytes (digest: 64 hex digits)."""
        with self._open("GET", f"/v2/{repo}/blobs/sha256:{digest}") as r:
            return r.read()

    def put_blob(self, repo: str, data: bytes) -> str:
        """Upload bytes as a blob, whatever they hash to; returns its sha256 hex."""
        digest = hashlib.sha256(data).hexdigest()
        with self._open("POST", f"/v2/{repo}/blobs/uploads/", b"") as r:
            location = r.headers["Location"]
        location = location.split(self.authority, 1)[-1]
        with self._open("PUT", f"{location}{'&' if '?' in location else '?'}digest=sha256:{digest}", data,
                        {"Content-Type": "application/octet-stream"}):
            pass
        return digest

    def put_manifest(self, repo: str, tag: str, raw: bytes,
                     media_type: str = "application/vnd.oci.image.manifest.v1+json") -> None:
        with self._open("PUT", f"/v2/{repo}/manifests/{tag}", raw, {"Content-Type": media_type}):
            pass

    def blob_gets(self) -> Counter[str]:
        """GETs of each blob (hex digest) it answered, by its access log (access_log=True)."""
        text = (self.workdir / "registry.log").read_text(errors="replace")
        return Counter(re.findall(r'"GET /v2/\S+/blobs/sha256:([0-9a-f]{64})\S* HTTP', text))

    def blob_files(self) -> int:
        """Blobs the registry stores on disk (each digest once, whatever the repository)."""
        root = self.workdir / "data" / "docker" / "registry" / "v2" / "blobs"
        return sum(1 for _ in root.rglob("data")) if root.exists() else 0


def push_small_image(registry: Registry, repo: str, tag: str, text: bytes = b"hello from the mirror\n") -> dict[str, bytes]:
    """A one-layer container image (a tar.gz holding hello.txt) pushed to
    ``registry``; its blobs (config and layer) by hex digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = text * 1000
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


def registry_env(tmp: Path) -> dict[str, str]:
    """An environment whose docker config is empty (the developer's own stays out)."""
    env = dict(os.environ)
    env["DOCKER_CONFIG"] = str(tmp / "docker-config")
    return env


@contextlib.contextmanager
def shared_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry for every test of a module (its fixture's scope), with
    an empty docker config while it runs."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_CONFIG", str(tmp_path_factory.mktemp("no-docker-config")))
        with Registry(tmp_path_factory.mktemp("registry")) as r:
            yield r
