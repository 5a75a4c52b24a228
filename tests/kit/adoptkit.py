"""Model directories as other tools leave them, for adopt's tests: a
Hugging Face cache repository in the layout huggingface_hub writes
(models--ORG--NAME, blobs/ named by sha256 for LFS files and by git blob
sha1 for small ones, snapshots/<commit>/ relative symlinks, refs/main) and
an Ollama models directory (blobs/sha256-<hex>,
manifests/registry.ollama.ai/library/<model>/<tag>)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path


def safetensors(n: int = 1024) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + bytes(range(256)) * (4 * n // 256)


COMMIT = hashlib.sha1(b"a commit").hexdigest()
REPO = "acme/tiny-model"


HF_FILES = {"config.json": b'{"model_type": "tiny"}\n', "model.safetensors": safetensors(),
            "tokenizer/vocab.txt": b"a\nb\nc\n"}
LFS = {"model.safetensors"}


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hf_cache(hub: Path, files: dict[str, bytes] = HF_FILES) -> Path:
    """A repository as huggingface_hub leaves it after hf_hub_download."""
    repo = hub / ("models--" + REPO.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for path, data in files.items():
        name = hashlib.sha256(data).hexdigest() if path in LFS else git_blob_sha1(data)
        (repo / "blobs" / name).write_bytes(data)
        link = repo / "snapshots" / COMMIT / path
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(repo / "blobs" / name, link.parent), link)
    return repo


GGUF = b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + b"\x01" * 4000
TEMPLATE = b"{{ .Prompt }}"
PARAMS = b'{"stop": ["</s>"]}'


def ollama_dir(top: Path, *, tags: tuple[str, ...] = ("latest", "q4")) -> Path:
    """~/.ollama/models: blobs/sha256-<hex>, manifests/registry.ollama.ai/library/tiny/<tag>."""
    models = top / "models"

    def blob(data: bytes, media_type: str) -> dict:
        return {"mediaType": media_type, "digest": f"sha256:{hashlib.sha256(data).hexdigest()}", "size": len(data)}

    config_data = b'{"model_format": "gguf", "model_family": "llama"}'
    config = blob(config_data, "application/vnd.docker.container.image.v1+json")
    layers = [blob(GGUF, "application/vnd.ollama.image.model"),
              blob(TEMPLATE, "application/vnd.ollama.image.template"),
              blob(PARAMS, "application/vnd.ollama.image.params")]
    manifest = json.dumps({"schemaVersion": 2, "config": config, "layers": layers,
                           "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}).encode()
    for tag in tags:
        ollama_model(models, manifest, [config_data, GGUF, TEMPLATE, PARAMS], "tiny", tag)
    return models


def ollama_model(models: Path, manifest: bytes, blobs: list[bytes], model: str, tag: str) -> Path:
    """One model as ``ollama pull`` leaves it in ``models``: its blobs and
    manifests/registry.ollama.ai/library/<model>/<tag>."""
    (models / "blobs").mkdir(parents=True, exist_ok=True)
    for data in blobs:
        (models / "blobs" / f"sha256-{hashlib.sha256(data).hexdigest()}").write_bytes(data)
    where = models / "manifests" / "registry.ollama.ai" / "library" / model
    where.mkdir(parents=True, exist_ok=True)
    (where / tag).write_bytes(manifest)
    return models
