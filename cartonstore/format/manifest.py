"""The MANIFEST file: one ``path=sha256`` line per file of the carton.

The sha256 of the MANIFEST bytes is the carton's identity (the model hash),
so the parser is strict: a MANIFEST that two tools could read differently
would give one model two names, or two models one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from cartonstore.errors import InvalidCarton

from ._toml import decode_utf8
from .digest import is_sha256
from .paths import validate_carton_path

MANIFEST = "MANIFEST"
_SHA256_ANY_CASE = re.compile(r"[0-9a-fA-F]{64}")
# Files the MANIFEST never lists: itself, and LINKS (which only the loader sees).
_UNLISTED = frozenset({"MANIFEST", "LINKS"})


def sha256_problem(s: object) -> str | None:
    """Why ``s`` is not a lowercase hex sha256, or None when it is."""
    if is_sha256(s):
        return None
    if not isinstance(s, str):
        return f"sha256 must be a string, not {type(s).__name__}"
    if _SHA256_ANY_CASE.fullmatch(s):
        return f"sha256 {s!r} must be lowercase hex"
    return f"sha256 {s!r} is not 64 hex digits"


@dataclass(frozen=True)
class Manifest:
    """A parsed MANIFEST: its exact bytes and its (path, sha256) entries, in file order."""

    raw: bytes
    entries: tuple[tuple[str, str], ...]

    @cached_property
    def digest(self) -> str:
        """The manifest hash (model hash): sha256 hex of the MANIFEST bytes."""
        return hashlib.sha256(self.raw).hexdigest()

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(path for path, _ in self.entries)

    def as_dict(self) -> dict[str, str]:
        """path -> sha256."""
        return dict(self.entries)


def parse_manifest(raw: bytes) -> Manifest:
    """Parse and validate MANIFEST bytes.

    Each line is ``path=sha256`` ending in "\\n" (the last line too), split at
    the last "=" since paths may contain "="; sha256 is 64 lowercase hex; the
    path is a safe carton path; lines are strictly sorted by UTF-8 bytes (so
    no duplicates); MANIFEST and LINKS are not listed; carton.toml is; no
    path is both a file and a folder of another.

    Raises InvalidCarton("MANIFEST", ..., field="line N") on the first problem.
    """
    if not raw:
        raise InvalidCarton(MANIFEST, "is empty; a carton lists at least carton.toml")
    text = decode_utf8(raw, MANIFEST)
    if not text.endswith("\n"):
        line = text.count("\n") + 1
        raise InvalidCarton(MANIFEST, "does not end with a newline", field=f"line {line}")
    entries = [_parse_line(line, number) for number, line in enumerate(text[:-1].split("\n"), 1)]
    _check_order(entry[0] for entry in entries)
    _check_tree(entries)
    return Manifest(raw=raw, entries=tuple(entries))


def _parse_line(line: str, number: int) -> tuple[str, str]:
    field = f"line {number}"
    if line.endswith("\r"):
        problem = "ends with '\\r\\n'; lines must end with '\\n' only"
        raise InvalidCarton(MANIFEST, problem, field=field)
    path, sep, sha = line.rpartition("=")
    if not sep:
        raise InvalidCarton(MANIFEST, f"expected 'path=sha256', got {line!r}", field=field)
    _check_entry(path, sha, field)
    return path, sha


def _check_entry(path: str, sha: str, field: str) -> None:
    validate_carton_path(path, file_for_errors=MANIFEST, field=field)
    if path in _UNLISTED:
        raise InvalidCarton(MANIFEST, f"must not list {path}", field=field)
    problem = sha256_problem(sha)
    if problem:
        raise InvalidCarton(MANIFEST, f"{problem} (for {path!r})", field=field)


def _check_order(paths: Iterable[str]) -> None:
    previous: bytes | None = None
    for number, path in enumerate(paths, 1):
        current = path.encode("utf-8")
        if previous is not None and current <= previous:
            problem = "duplicate entry" if current == previous else "is out of order"
            raise InvalidCarton(
                MANIFEST,
                f"{path!r} {problem}; entries must be sorted by their UTF-8 bytes, each once",
                field=f"line {number}",
            )
        previous = current


def _check_tree(entries: list[tuple[str, str]]) -> None:
    """carton.toml is listed, and no listed file is also the folder of another."""
    paths = {path for path, _ in entries}
    if "carton.toml" not in paths:
        raise InvalidCarton(MANIFEST, "does not list carton.toml")
    for number, (path, _) in enumerate(entries, 1):
        parts = path.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            if folder in paths:
                raise InvalidCarton(
                    MANIFEST,
                    f"{path!r} puts a file inside {folder!r}, which is listed as a file",
                    field=f"line {number}",
                )


def build_manifest(files: Mapping[str, str]) -> bytes:
    """MANIFEST bytes for ``files`` (path -> sha256), sorted by UTF-8 bytes.

    Validates what parse_manifest validates, so the result always parses.
    Raises InvalidCarton("MANIFEST", ..., field="entry 'path'") for a bad
    path or sha256, or when carton.toml is missing.
    """
    for path, sha in files.items():
        _check_entry(path, sha, f"entry {path!r}")
    ordered = sorted(files.items(), key=lambda item: item[0].encode("utf-8"))
    _check_tree(ordered)
    return "".join(f"{path}={sha}\n" for path, sha in ordered).encode("utf-8")
