"""required_framework_version: Rust semver VersionReq semantics against
installed framework versions."""

from __future__ import annotations

import pytest

from cartonstore.errors import InvalidInput
from cartonstore.format.semver import Version, parse_requirement, parse_version, version_satisfies

# (requirement, version, satisfied): the crate's documented meanings.
TABLE = [
    # bare version = caret
    ("1.2.3", "1.2.3", True), ("1.2.3", "1.9.0", True), ("1.2.3", "2.0.0", False), ("1.2.3", "1.2.2", False),
    ("^1.2.3", "1.99.99", True), ("^0.2.3", "0.2.9", True), ("^0.2.3", "0.3.0", False),
    ("^0.0.3", "0.0.3", True), ("^0.0.3", "0.0.4", False), ("^1.2", "1.2.0", True), ("^1.2", "1.1.9", False),
    ("^0.0", "0.0.7", True), ("^0.0", "0.1.0", False), ("^1", "1.99.0", True), ("^1", "2.0.0", False),
    ("^0", "0.9.9", True), ("1.16", "1.17.3", True), ("2.0", "2.13.0+cpu", True),
    # exact, with partial versions meaning "any patch/minor"
    ("=3.10", "3.10.12", True), ("=3.10", "3.11.0", False), ("=3", "3.0.1", True), ("=1.2.3", "1.2.4", False),
    ("=1.2.3", "1.2.3", True),
    # greater / less, with the crate's partial-version rules
    (">1.2.3", "1.2.4", True), (">1.2.3", "1.2.3", False), (">1.2", "1.2.9", False), (">1.2", "1.3.0", True),
    (">1", "1.9.9", False), (">1", "2.0.0", True), (">=1.2", "1.2.0", True), (">=1.2", "1.1.9", False),
    (">=1", "1.0.0", True), ("<1.2.3", "1.2.2", True), ("<1.2.3", "1.2.3", False), ("<1.2", "1.1.99", True),
    ("<1.2", "1.2.0", False), ("<1", "0.9.0", True), ("<1", "1.0.0", False), ("<=1.2", "1.2.99", True),
    ("<=1.2", "1.3.0", False), ("<=1", "1.99.0", True), ("<=1.2.3", "1.2.3", True),
    # tilde
    ("~1.2.3", "1.2.9", True), ("~1.2.3", "1.3.0", False), ("~1.2.3", "1.2.2", False), ("~1.2", "1.2.0", True),
    ("~1.2", "1.3.0", False), ("~1", "1.9.0", True), ("~1", "2.0.0", False),
    # wildcards
    ("*", "0.0.1", True), ("*", "99.0.0", True), ("1.*", "1.5.0", True), ("1.*", "2.0.0", False),
    ("1.2.*", "1.2.7", True), ("1.2.*", "1.3.0", False), ("1.x", "1.0.0", True), ("1.2.X", "1.2.0", True),
    (">=1.*", "1.0.0", True), (">=1.*", "0.9.0", False),
    # comparator lists: all must hold
    (">=1.16, <2", "1.16.3", True), (">=1.16, <2", "2.0.0", False), (">=1.16,<2", "1.15.9", False),
    (" >= 3.8 , < 3.12 ", "3.11.7", True), (">= 3.8, < 3.12", "3.12.0", False),
    # pre-releases only match a requirement naming one on the same major.minor.patch
    (">=1.16", "1.20.0rc1", False), ("*", "1.0.0-alpha", False), (">=1.20.0-rc.0", "1.20.0rc1", True),
    (">=1.20.0-rc1", "1.20.0rc2", True), (">=1.20.0-rc1", "1.20.0", True), ("<1.20.0", "1.20.0rc1", False),
    (">=1.2.3-alpha.1", "1.2.3-alpha.2", True), (">=1.2.3-alpha.1", "1.2.4-alpha.2", False),
    ("=1.2.3-rc2", "1.2.3rc2", True), (">=1.2.3-rc2", "1.2.3rc10", True), ("^1.2.3-beta", "1.2.3-alpha", False),
    ("~1.2.3-beta", "1.2.3-beta.2", True), (">1.2.3-alpha", "1.2.3", True),
]


@pytest.mark.parametrize(("requirement", "version", "expected"), TABLE)
def test_version_satisfies(requirement, version, expected) -> None:
    assert version_satisfies(version, requirement) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1.16.3", Version(1, 16, 3)), ("3.11.7", Version(3, 11, 7)), ("2.13.0+cpu", Version(2, 13, 0)),
     ("2.1.0+cu121", Version(2, 1, 0)), ("1.20.0rc1", Version(1, 20, 0, ("rc1",))), ("3.11", Version(3, 11, 0)),
     ("7", Version(7, 0, 0)), ("v1.2.3", Version(1, 2, 3)), ("1.2.3.4", Version(1, 2, 3)),
     ("1.2.3-alpha.1", Version(1, 2, 3, ("alpha", "1"))), ("2.0.0.dev20230101", Version(2, 0, 0, ("dev20230101",))),
     ("1.0.0.post1", Version(1, 0, 0)), ("2.1.0a0+git1234", Version(2, 1, 0, ("a0",))),
     ("1.5.0b2.post1", Version(1, 5, 0, ("b2",))), (" 1.2.3 ", Version(1, 2, 3))],
)
def test_parse_version(text, expected) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "x1.2", "1.2.3-", "1.2.3 beta", None])
def test_bad_versions(text) -> None:
    with pytest.raises(InvalidInput):
        parse_version(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "is empty"), ("  ", "is empty"), (">=1.2,", "has an empty comparator"),
     ("1.2 3.4", "'1.2 3.4' is not a comparator"), ("=>1.2", "is not a comparator"), ("~>1.2", "is not a comparator"),
     ("1.*.3", "has a patch version after a wildcard"), ("1.2-rc1", "has a pre-release without a full version"),
     ("1.2.*-rc1", "has a pre-release without a full version"), ("01.2", "has a leading zero"),
     ("latest", "is not a comparator"), (">= 1.2.3.4", "is not a comparator"), (3, "must be a string")],
)
def test_bad_requirements(text, message) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_requirement(text)
    assert message in str(info.value)
    if isinstance(text, str) and text.strip():
        assert repr(text.strip()) in str(info.value) or repr(text) in str(info.value)


def test_parse_requirement_keeps_comparators() -> None:
    req = parse_requirement(">=1.16, <2.0.0")
    assert [(c.op, c.major, c.minor, c.patch) for c in req.comparators] == [(">=", 1, 16, None), ("<", 2, 0, 0)]
    assert str(req) == ">=1.16, <2.0.0"
    assert parse_requirement("*").comparators == ()
    assert parse_requirement("1.2").comparators[0].op == "^"
    assert parse_requirement("1.2.*").comparators[0].op == "*"
    assert req.matches(Version(1, 17, 0)) and req.matches("1.17.0")
