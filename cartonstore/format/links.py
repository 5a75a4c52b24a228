"""The LINKS file: where to fetch files that a carton's zip leaves out.

LINKS is TOML (``version = 1`` and a ``[urls]`` table of sha256 -> URLs). It
is not part of the MANIFEST, so it never changes a model's hash; the URLs it
gives are only hints, checked by the fetcher (schemes, hosts) and verified
by hash once fetched.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import tomli_w

from cartonstore.errors import InvalidCarton

from ._toml import TomlTable, is_int, load_toml, type_name
from .manifest import sha256_problem

LINKS = "LINKS"
LINKS_VERSION = 1
# A URL with control characters or lone surrogates is never valid, and a
# newline in one could smuggle a header into an HTTP request.
_BAD_URL_CHARS = re.compile(r"[\x00-\x20\x7f\ud800-\udfff]")


def parse_links(raw: bytes) -> dict[str, tuple[str, ...]]:
    """Parse LINKS bytes into sha256 -> URLs (in file order).

    Requires ``version = 1`` and a ``[urls]`` table whose keys are lowercase
    hex sha256 digests and whose values are non-empty arrays of non-empty
    strings without spaces or control characters. Unknown top-level keys are
    ignored. URL schemes are not checked here (the fetcher does that).
    Raises InvalidCarton("LINKS", ...) on the first problem.
    """
    table = TomlTable(load_toml(raw, LINKS), LINKS)
    version = table.require("version")
    if not is_int(version) or version != LINKS_VERSION:
        raise table.error(
            "version", f"unsupported LINKS version {version!r}; this cartonstore reads version 1"
        )
    urls = table.req_table("urls")
    return {sha: _urls(urls, sha, value) for sha, value in urls.data.items()}


def _urls(table: TomlTable, sha: str, value: object) -> tuple[str, ...]:
    problem = sha256_problem(sha)
    if problem:
        raise table.error(sha, f"key must be a file's sha256: {problem}")
    if not isinstance(value, list):
        raise table.error(sha, f"must be an array of URLs, not {type_name(value)}")
    if not value:
        raise table.error(sha, "must list at least one URL")
    for i, url in enumerate(value):
        problem = _url_problem(url)
        if problem:
            raise InvalidCarton(LINKS, problem, field=f"{table.field(sha)}[{i}]")
    return tuple(value)


def _url_problem(url: object) -> str | None:
    if not isinstance(url, str):
        return f"must be a URL string, not {type_name(url)}"
    if not url:
        return "must be a URL, not an empty string"
    bad = _BAD_URL_CHARS.search(url)
    if bad:
        return f"URL {url!r} contains a space or control character ({bad.group()!r})"
    return None


def build_links(urls: Mapping[str, Sequence[str]]) -> bytes:
    """LINKS bytes for ``urls`` (sha256 -> URLs), keys sorted.

    Validates what parse_links validates, so the result always parses.
    Raises InvalidCarton("LINKS", ..., field="urls.<sha256>").
    """
    table = TomlTable({}, LINKS, "urls")
    checked = {sha: list(_urls(table, sha, _as_list(urls[sha]))) for sha in sorted(urls)}
    return tomli_w.dumps({"version": LINKS_VERSION, "urls": checked}).encode("utf-8")


def _as_list(value: object) -> object:
    # A lone string is a Sequence[str] too; keep it whole so that it is
    # reported as "not an array" instead of being split into characters.
    return list(value) if isinstance(value, (list, tuple)) else value
