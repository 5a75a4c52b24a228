"""Pushing cartons to a real registry: the carton most OCI tests push, the
fetch settings for a registry, a push through the library, and a
self-signed certificate for an https registry or proxy."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import MINIMAL_TOML

from cartonstore.config.pulling import standard_puller, standard_sources
from cartonstore.fetch.http.config import RegistryConfig
from cartonstore.fetch.puller import PullResult
from cartonstore.oci.push import PushResult, push_carton
from cartonstore.store import Store
from kit import fetchkit
from kit.fetchkit import fast_config

BIG = bytes(range(256)) * (3 << 12)   # 3 MiB: several chunks at a 1 MiB chunk size
FILES = {"carton.toml": MINIMAL_TOML, "model/weights.bin": BIG, "model/vocab.txt": b"a\nb\nc\n",
         "model/copy.txt": b"a\nb\nc\n"}


def config(**registries) -> object:
    """Fast fetch settings for a real registry process, but for the stall
    timeout: no OCI test is about stalls, and a registry on a loaded CI
    machine took longer than fast_config's 0.5 s to answer an upload."""
    registries.setdefault("chunk_size", 1 << 20)
    return fast_config(stall_timeout=10.0, registries=RegistryConfig(**registries))


def pull(store: Store, source: str, cfg=None, **kw) -> PullResult:
    """fetchkit's pull by a Puller that reads oci:// (the standard set)."""
    return fetchkit.pull(store, source, cfg, sources=standard_sources(), **kw)


def materialize(store: Store, ref: str, cfg=None) -> Path:
    return fetchkit.materialize(store, ref, cfg, sources=standard_sources())


def push(store: Store, ref: str, target: str, cfg, fmt: str = "carton") -> PushResult:
    async def run() -> PushResult:
        async with standard_puller(store, cfg) as p:
            return await push_carton(p, ref, target, fmt)
    return asyncio.run(run())


def make_cert(directory: Path) -> tuple[Path, Path]:
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = directory / "cert.pem", directory / "key.pem"
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key
