"""A daemon never hands out a model whose adopted file was changed through
the other tool's path: a lease of a model directory built before the
change is refused, naming the file (the blob is quarantined, as verify
--repair does), while untouched models lease as before."""

from __future__ import annotations

import hashlib
from pathlib import Path

from kit.adoptkit import HF_FILES, hf_cache, ollama_dir
from kit.daemonkit import DaemonProcess, call

from cartonstore.store import Store


def test_a_lease_of_a_model_changed_through_the_other_tools_path_is_refused(short_tmp: Path) -> None:
    root = short_tmp / "root"
    repo = hf_cache(short_tmp / "hub")
    with Store(root) as store:
        store.adopt(repo)
        store.adopt(ollama_dir(short_tmp))
        store.materialize("acme-tiny-model")
    with DaemonProcess(root, listen=None, socket_path=short_tmp / "d.sock") as daemon:
        status, body = call(daemon, "POST", "/v1/leases", json={"model": "acme-tiny-model", "ttl": 30})
        assert status == 200, body
        lfs = repo / "blobs" / hashlib.sha256(HF_FILES["model.safetensors"]).hexdigest()
        lfs.chmod(0o644)
        with open(lfs, "r+b") as f:   # in place, as a tool writing through its own path would
            f.seek(200)
            f.write(b"\xee" * 4)
        status, body = call(daemon, "POST", "/v1/leases", json={"model": "acme-tiny-model", "ttl": 30})
        assert status == 500 and isinstance(body, dict), body
        assert f"adopted from {lfs}, was changed through that path" in body["error"]
        status, body = call(daemon, "POST", "/v1/leases", json={"model": "tiny-latest", "ttl": 30})
        assert status == 200, body
