"""What a directory another tool wrote holds, read for ``cartonstore adopt``:
a Hugging Face cache repository, an Ollama models directory, or any
directory of model files. Nothing here reads a file's bytes; each file is
named with the path its tool shows and the hash its tool's name for it
claims, which the store checks while adopting it.

- Hugging Face (``models--ORG--NAME``, as huggingface_hub writes it):
  ``refs/main`` names the commit, ``snapshots/<commit>/`` holds the
  repository's paths as relative symlinks into ``blobs/``, where an LFS
  file is named by its sha256 and a small git file by its git blob sha1.
  A ``snapshots/<commit>`` directory given is that commit of its repository.
- Ollama (``blobs/sha256-<hex>``, ``manifests/<registry>/<ns>/<model>/<tag>``):
  each manifest is a model, its layers named by their media type as an OCI
  pull of it names them (format/ollama.py: ``model.gguf``, ``template``,
  ``params.json``...), its carton the pull's (model_name the model's
  repository name, nothing more said), so one model is one carton
  whichever way it came.
- Any other directory: its files at their relative paths.

A symlink may lead only to a file inside the directory adopted; anything
but a regular file (a device, a pipe) is refused by name. Each file's
(device, inode) is recorded as it is listed: the store reads only a file
that is still that inode when it opens it, so a directory on the way
swapped for a symlink afterwards cannot lead it outside the directory.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from cartonstore.errors import InvalidInput, NotFound
from cartonstore.format.ollama import ollama_file_names

HF_PREFIX = "models--"
DESCRIPTION_CHARS = 100
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")
OLLAMA_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
OLLAMA_LIBRARY = ("registry.ollama.ai", "library")
@dataclass(frozen=True)
class Claim:
    """The hash a file's name claims for its bytes: ``sha256`` (an LFS or
    Ollama blob) or ``git-sha1`` (a small file in git: sha1 of
    ``blob <size>\\0`` and the bytes)."""

    algorithm: str
    hexdigest: str


@dataclass(frozen=True)
class AdoptableFile:
    path: str               # as the tool names it (a carton path under model/)
    disk: Path              # the file itself, symlinks resolved
    claim: Claim | None     # None: any bytes (a plain directory's file)
    dev: int                # the file's device and inode when it was listed
    ino: int


@dataclass(frozen=True)
class AdoptableModel:
    model_name: str         # ORG/NAME, name:tag, a directory's name; its default name in the store
    files: tuple[AdoptableFile, ...]
    origin: str             # where it was found: the source recorded, the label in errors
    description: str | None  # carton.toml's short_description
    carton_name: str | None = None  # carton.toml's model_name where it is not model_name (Ollama: as pulled)


def read_adoptable(path: Path) -> list[AdoptableModel]:
    """The models a directory holds, by its layout (see the module's doc)."""
    if not os.path.lexists(path):
        raise NotFound(f"no such directory: {path}", subject=str(path))
    if not path.is_dir():
        raise InvalidInput(f"{path} is not a directory: adopt takes a Hugging Face cache repository "
                           "(models--ORG--NAME), an Ollama models directory or a directory of model files",
                           subject=str(path))
    root = path.resolve()
    if root.name.startswith(HF_PREFIX) and (root / "snapshots").is_dir():
        return [_hf_repository(root)]
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith(HF_PREFIX):
        return [_hf_repository(root.parent.parent, root.name)]   # one snapshot, named by its directory
    if any(d.startswith(HF_PREFIX) for d in os.listdir(root)):
        raise InvalidInput(f"{root} holds Hugging Face cache repositories: adopt each one "
                           f"({root}/{HF_PREFIX}ORG--NAME)", subject=str(root))
    if (root / "blobs").is_dir() and (root / "manifests").is_dir():
        return _ollama_models(root)
    return [AdoptableModel(root.name, tuple(_plain_files(root)), str(root), _short(f"files of {root}"))]


# -- Hugging Face ----------------------------------------------------------------

def _hf_repository(root: Path, commit: str | None = None) -> AdoptableModel:
    repo_id = root.name[len(HF_PREFIX):].replace("--", "/", 1)
    commit = commit or _hf_commit(root)
    snapshot = root / "snapshots" / commit
    files = []
    for rel, full in _walk(snapshot):
        disk, st = _inside(full, root, rel)
        files.append(AdoptableFile(rel, disk, _hf_claim(disk, root), st.st_dev, st.st_ino))
    return AdoptableModel(repo_id, tuple(files), f"{root}@{commit}",
                          _short(f"{repo_id} at commit {commit}, from the Hugging Face cache"))


def _hf_commit(root: Path) -> str:
    """refs/main's commit; else the only snapshot there is."""
    ref = root / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text().strip()
        if not _HEX40.fullmatch(commit):
            raise InvalidInput(f"{ref} holds {commit[:80]!r}, not a commit hash", subject=str(ref))
        if not (root / "snapshots" / commit).is_dir():
            raise NotFound(f"{ref} names commit {commit}, which has no snapshot in {root / 'snapshots'}",
                           subject=str(ref))
        return commit
    snapshots = sorted(d for d in os.listdir(root / "snapshots") if _HEX40.fullmatch(d))
    if len(snapshots) != 1:
        raise InvalidInput(f"{root} has no refs/main and {len(snapshots)} snapshots: which one to adopt is not "
                           "clear (download it again with huggingface_hub to write refs/main)", subject=str(root))
    return snapshots[0]


def _hf_claim(disk: Path, root: Path) -> Claim | None:
    """A file in blobs/ claims the hash it is named by; a snapshot file
    that is no link (a cache written without symlinks) claims nothing."""
    if disk.parent != root / "blobs":
        return None
    if _HEX64.fullmatch(disk.name):
        return Claim("sha256", disk.name)
    if _HEX40.fullmatch(disk.name):
        return Claim("git-sha1", disk.name)
    raise InvalidInput(f"{disk} is named by no hash (huggingface_hub names blobs by their sha256 or git sha1)",
                       subject=str(disk))


# -- Ollama ------------------------------------------------------------------------

def _ollama_models(root: Path) -> list[AdoptableModel]:
    models = []
    for rel, full in _walk(root / "manifests"):
        parts = rel.split("/")
        if len(parts) != 4:
            raise InvalidInput(f"{full} is not where Ollama keeps a manifest "
                               "(manifests/<registry>/<namespace>/<model>/<tag>)", subject=str(full))
        models.append(_ollama_model(root, _inside(full, root, rel)[0], parts))
    if not models:
        raise InvalidInput(f"{root / 'manifests'} holds no manifest: nothing to adopt", subject=str(root))
    return models


def _ollama_model(root: Path, manifest: Path, parts: list[str]) -> AdoptableModel:
    registry, namespace, model, tag = parts
    name = f"{model}:{tag}" if (registry, namespace) == OLLAMA_LIBRARY else f"{registry}/{namespace}/{model}:{tag}"
    try:
        doc = json.loads(manifest.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidInput(f"Ollama manifest {manifest} is not JSON: {e}", subject=str(manifest)) from None
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or not all(isinstance(layer, dict) for layer in layers):
        raise InvalidInput(f"Ollama manifest {manifest} has no list of layers", subject=str(manifest))
    paths = ollama_file_names([layer.get("mediaType") for layer in layers], f"Ollama manifest {manifest}")
    files = tuple(_ollama_file(root, manifest, path, layer) for path, layer in zip(paths, layers, strict=True))
    return AdoptableModel(name, files, str(manifest), None, carton_name=model)


def _ollama_file(root: Path, manifest: Path, path: str, layer: dict) -> AdoptableFile:
    digest = layer.get("digest")
    match = OLLAMA_DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if match is None:
        why = " (a path with '..' would leave blobs/)" if isinstance(digest, str) and ".." in digest else ""
        raise InvalidInput(f"Ollama manifest {manifest}: the digest of {path}, {str(digest)[:100]!r}, is not "
                           f"sha256:<64 hex digits>{why}", subject=str(manifest))
    hexdigest = match.group(1)
    blob = root / "blobs" / f"sha256-{hexdigest}"
    if not os.path.lexists(blob):
        raise NotFound(f"Ollama manifest {manifest} lists {path} as {digest}, but {blob} is not there",
                       subject=str(blob))
    disk, st = _inside(str(blob), root, f"blobs/{blob.name}")
    return AdoptableFile(path, disk, Claim("sha256", hexdigest), st.st_dev, st.st_ino)


# -- any directory -------------------------------------------------------------

def _plain_files(root: Path) -> list[AdoptableFile]:
    files = []
    for rel, full in _walk(root):
        disk, st = _inside(full, root, rel)
        files.append(AdoptableFile(rel, disk, None, st.st_dev, st.st_ino))
    if not files:
        raise InvalidInput(f"{root} holds no files: nothing to adopt", subject=str(root))
    return files


def _walk(top: Path) -> list[tuple[str, str]]:
    """(relative path, full path) of every file under top, in order; a
    symlink to a directory is refused (its files would be adopted twice)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(top, onerror=_raise):
        dirnames.sort()
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                full = os.path.join(dirpath, d)
                raise InvalidInput(f"{full} is a symlink to a directory ({os.readlink(full)!r}): adopt takes files",
                                   subject=full)
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            out.append((os.path.relpath(full, top).replace(os.sep, "/"), full))
    return out


def _inside(full: str, root: Path, rel: str) -> tuple[Path, os.stat_result]:
    """The regular file ``full`` is, symlinks resolved, and its stat;
    refused unless it stays inside ``root``."""
    disk = Path(os.path.realpath(full))
    if disk != root and root not in disk.parents:
        raise InvalidInput(f"{rel} is a symlink out of {root} (to {os.readlink(full)!r}): adopt takes only "
                           "files inside the directory it adopts", subject=full)
    try:
        st = os.stat(disk)
    except FileNotFoundError:
        raise NotFound(f"{rel} is a dangling symlink (to {os.readlink(full)!r})", subject=full) from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(f"{rel} is not a regular file ({_kind(st.st_mode)}): adopt takes files", subject=full)
    return disk, st


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a file"


def _short(description: str) -> str:
    """carton.toml's short_description holds 100 characters."""
    return description if len(description) <= DESCRIPTION_CHARS else description[:DESCRIPTION_CHARS - 3] + "..."


def _raise(error: OSError) -> None:
    raise error
