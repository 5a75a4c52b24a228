"""The Hub's answer to ``/api/models/{repo}/revision/{rev}?blobs=true``,
read and checked (pure): the commit the revision names, and each file with
its size, its LFS sha256 (the blob key: a file the store has from any
source is not fetched) or, for a file kept in git, its git object id."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeGuard

from cartonstore.errors import InvalidInput
from cartonstore.format import strict_json
from cartonstore.format.paths import carton_path_problem

from .reference import HubReference, is_commit

_DECODE = strict_json.decoder()
MAX_LISTING_SIZE = 64 << 20
"""A listing longer than this is refused (the Hub's largest repositories
list some ten thousand files, a few MiB)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_OID = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str | None
    """An LFS file's sha256; None for a file kept in git, hashed as it comes."""
    git_oid: str | None = None
    """A git file's object id (sha1 of ``blob SIZE\\0`` and its bytes), checked as it comes."""


@dataclass(frozen=True)
class Revision:
    commit: str
    files: tuple[HubFile, ...]


def parse_revision(raw: bytes, ref: HubReference) -> Revision:
    """InvalidInput naming the field that is wrong, before any file is
    fetched: a path a carton may not hold (absolute, ``..``), a path listed
    twice, a key repeated in one object."""
    where = f"the Hub's listing of {ref}"

    def bad(problem: str) -> InvalidInput:
        return InvalidInput(f"{where}: {problem}", subject=str(ref))

    try:
        doc = _DECODE(raw.decode())
    except (ValueError, UnicodeDecodeError) as e:   # RepeatedKey is a ValueError
        raise bad(f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise bad("not a JSON object")
    commit = doc.get("sha")
    if not isinstance(commit, str) or not is_commit(commit):
        raise bad(f"'sha' is {commit!r}, not a commit id (40 hex digits)")
    siblings = doc.get("siblings")
    if not isinstance(siblings, list):
        raise bad("no 'siblings' list of files")
    files: dict[str, HubFile] = {}
    for sibling in siblings:
        if not isinstance(sibling, dict) or not isinstance(sibling.get("rfilename"), str):
            raise bad(f"a sibling without an rfilename: {str(sibling)[:100]}")
        path = sibling["rfilename"]
        problem = carton_path_problem(path)
        if problem is not None:
            raise bad(f"file {path[:200]!r} is not a path a model's file may have: it {problem}")
        if path in files:
            raise bad(f"file {path[:200]!r} is listed twice")
        files[path] = _file(sibling, bad)
    return Revision(commit, tuple(files.values()))


def _file(sibling: dict, bad: Callable[[str], InvalidInput]) -> HubFile:
    path = sibling["rfilename"]
    lfs = sibling.get("lfs")
    if lfs is not None:
        sha256, size = (lfs.get("sha256"), lfs.get("size")) if isinstance(lfs, dict) else (None, None)
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise bad(f"{path}: lfs.sha256 is {sha256!r}, not a sha256")
        if not _is_size(size):
            raise bad(f"{path}: lfs.size is {size!r}, not a size")
        return HubFile(path, size, sha256)
    size, oid = sibling.get("size"), sibling.get("blobId")
    if not _is_size(size):
        raise bad(f"{path}: size is {size!r}, not a size (the listing must be asked with blobs=true)")
    if oid is not None and (not isinstance(oid, str) or not _GIT_OID.fullmatch(oid)):
        raise bad(f"{path}: blobId is {oid!r}, not a git object id")
    return HubFile(path, size, None, oid)


def _is_size(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
