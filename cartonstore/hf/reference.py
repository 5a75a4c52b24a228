"""``hf://ORG/NAME[@REVISION][?include=GLOB&exclude=GLOB]``: a Hugging Face
model repository at a revision, and the files of it wanted (pure).

The globs select files as huggingface_hub's ``allow_patterns`` and
``ignore_patterns`` do (fnmatch; a pattern ending in ``/`` takes the whole
folder). ``add --include/--exclude`` write them into the reference, so a
daemon load's ``source`` and the recorded source say them too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from fnmatch import fnmatch
from urllib.parse import parse_qsl, quote, urlencode

from cartonstore.errors import InvalidInput

SCHEME = "hf://"
DEFAULT_REVISION = "main"
_REPO = re.compile(r"(?:[\w.-]+/)?[\w.-]+", re.ASCII)   # the Hub's ids are ASCII; they go unquoted into URLs
_COMMIT = re.compile(r"[0-9a-f]{40}")
MAX_REPO_LENGTH = 96


def is_commit(revision: str) -> bool:
    return _COMMIT.fullmatch(revision) is not None


@dataclass(frozen=True)
class HubReference:
    repo: str
    """``ORG/NAME`` (or ``NAME``), as the Hub spells it."""
    revision: str = DEFAULT_REVISION
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __str__(self) -> str:
        query = urlencode([("include", g) for g in self.include] + [("exclude", g) for g in self.exclude])
        return f"{SCHEME}{self.repo}@{self.revision}" + (f"?{query}" if query else "")

    def at(self, commit: str) -> HubReference:
        """The same files at the commit the revision names."""
        return replace(self, revision=commit)

    def wants(self, path: str) -> bool:
        """Whether the globs select this file (all of them without --include)."""
        return (not self.include or any(fnmatch(path, _folder(g)) for g in self.include)) \
            and not any(fnmatch(path, _folder(g)) for g in self.exclude)


def _folder(pattern: str) -> str:
    return pattern + "*" if pattern.endswith("/") else pattern


def parse_reference(text: str) -> HubReference:
    """``hf://ORG/NAME[@REV][?include=..&exclude=..]``; InvalidInput naming
    what is wrong."""
    if text[:len(SCHEME)].lower() != SCHEME:
        raise InvalidInput(f"{text!r} is not an hf:// reference (hf://ORG/NAME[@REVISION])", subject=text)
    body, _, query = text[len(SCHEME):].partition("?")
    repo, at, revision = body.partition("@")
    repo = repo.strip("/")
    if not _REPO.fullmatch(repo) or "--" in repo or ".." in repo or len(repo) > MAX_REPO_LENGTH \
            or repo.startswith((".", "-")) or repo.endswith((".", "-")):
        raise InvalidInput(f"{text!r}: {repo!r} is not a Hub repository id (ORG/NAME: letters, digits, '-', '_', "
                           f"'.', at most {MAX_REPO_LENGTH} characters, no '--' or '..')", subject=text)
    if at and (not revision or any(c.isspace() for c in revision) or ".." in revision):
        raise InvalidInput(f"{text!r}: {revision!r} is not a revision (a branch, tag or commit)", subject=text)
    include: list[str] = []
    exclude: list[str] = []
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in ("include", "exclude") or not value:
            raise InvalidInput(f"{text!r}: {key}={value!r}: an hf:// reference takes include=GLOB and "
                               f"exclude=GLOB only", subject=text)
        (include if key == "include" else exclude).append(value)
    return HubReference(repo, revision if at else DEFAULT_REVISION, tuple(include), tuple(exclude))


def with_patterns(text: str, include: Iterable[str], exclude: Iterable[str]) -> str:
    """The reference with more globs (``add --include/--exclude``)."""
    if text[:len(SCHEME)].lower() != SCHEME:
        raise InvalidInput(f"--include and --exclude select files of an hf:// repository; {text!r} is not one",
                           subject=text)
    ref = parse_reference(text)
    return str(replace(ref, include=(*ref.include, *include), exclude=(*ref.exclude, *exclude)))


def api_path(repo: str, revision: str) -> str:
    """The Hub's listing of a revision: its commit, and each file with its
    size and, for LFS files, sha256 (``blobs=true``, as huggingface_hub's
    ``model_info(files_metadata=True)`` asks)."""
    return f"/api/models/{repo}/revision/{quote(revision, safe='')}?blobs=true"


def resolve_path(repo: str, commit: str, path: str) -> str:
    return f"/{repo}/resolve/{quote(commit, safe='')}/{quote(path)}"
