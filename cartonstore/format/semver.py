"""Carton's ``required_framework_version``: a version requirement in the
syntax of the Rust ``semver`` crate's VersionReq, checked against the
version of an installed framework.

Requirement syntax (as the crate parses it): comparators separated by
commas, all of which must match. A comparator is an operator (``=``, ``>``,
``>=``, ``<``, ``<=``, ``~``, ``^``; none means ``^``) and a version that may
be partial (``=3.10`` means any 3.10.x) or end in a wildcard (``1.*``,
``1.2.x``); ``*`` alone matches every release. A pre-release version only
satisfies a requirement that names a pre-release of the same
major.minor.patch, as in the crate.

Installed versions come from Python packages, so they are read leniently:
"2.13.0+cpu" drops its local part, "3.11" is 3.11.0, "1.20.0rc1" is the
pre-release "rc1" of 1.20.0, ".postN" suffixes count as the release, and
components past the patch are ignored. Pre-release identifiers with digits
after letters compare naturally ("rc2" < "rc10"), which the crate would
compare as plain text; for identifiers the crate itself produces
("alpha.1", "rc.2") the order is the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cartonstore.errors import InvalidInput

OPERATORS = ("=", ">", ">=", "<", "<=", "~", "^")
_WILDCARD = "*"  # the operator a comparator like "1.*" gets: exact on what it names

_COMPARATOR = re.compile(
    r"(?P<op>>=|<=|=|>|<|~|\^)?\s*"
    r"(?P<major>\d+)"
    r"(?:\.(?P<minor>\d+|[*xX]))?"
    r"(?:\.(?P<patch>\d+|[*xX]))?"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)
_VERSION_CORE = re.compile(r"[vV]?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\.\d+)*")
_POST_RELEASE = re.compile(r"[-_.]?(?:post|rev|r)[-_.]?\d*$")
_IDENTIFIER = re.compile(r"[0-9A-Za-z-]+")
_NATURAL_PART = re.compile(r"\d+|\D+")

PreKey = tuple[tuple[int, int | str], ...]


def _pre_key(pre: tuple[str, ...]) -> tuple[int, tuple[PreKey, ...]]:
    """Sort key of a pre-release: a release (no identifiers) sorts after
    every pre-release of the same version; numeric identifiers sort before
    alphanumeric ones."""
    if not pre:
        return (1, ())
    keys: list[PreKey] = []
    for ident in pre:
        if ident.isdigit():
            keys.append(((0, int(ident)),))
        else:
            keys.append(
                ((1, 0), *tuple((0, int(p)) if p.isdigit() else (1, p) for p in _NATURAL_PART.findall(ident)))
            )
    return (0, tuple(keys))


@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(self.pre)}" if self.pre else core


@dataclass(frozen=True)
class Comparator:
    op: str  # one of OPERATORS, or "*" for a default-operator wildcard
    major: int
    minor: int | None
    patch: int | None
    pre: tuple[str, ...] = ()

    def matches(self, v: Version) -> bool:
        """Whether ``v`` satisfies this comparator, pre-release gating aside."""
        op = self.op
        if op in ("=", _WILDCARD):
            return self._exact(v)
        if op == ">":
            return self._greater(v)
        if op == ">=":
            return self._exact(v) or self._greater(v)
        if op == "<":
            return self._less(v)
        if op == "<=":
            return self._exact(v) or self._less(v)
        if op == "~":
            return self._tilde(v)
        return self._caret(v)

    def _exact(self, v: Version) -> bool:
        return (
            v.major == self.major
            and (self.minor is None or v.minor == self.minor)
            and (self.patch is None or v.patch == self.patch)
            and v.pre == self.pre
        )

    def _compare(self, v: Version) -> int | None:
        """-1/0/1 for v below/equal/above the comparator's version on the
        parts it names; None when v agrees on every part it names but one is
        left out (so v is neither greater nor less)."""
        if v.major != self.major:
            return -1 if v.major < self.major else 1
        if self.minor is None:
            return None
        if v.minor != self.minor:
            return -1 if v.minor < self.minor else 1
        if self.patch is None:
            return None
        if v.patch != self.patch:
            return -1 if v.patch < self.patch else 1
        mine, theirs = _pre_key(self.pre), _pre_key(v.pre)
        return 0 if mine == theirs else (-1 if theirs < mine else 1)

    def _greater(self, v: Version) -> bool:
        return self._compare(v) == 1

    def _less(self, v: Version) -> bool:
        return self._compare(v) == -1

    def _tilde(self, v: Version) -> bool:
        if v.major != self.major or (self.minor is not None and v.minor != self.minor):
            return False
        if self.patch is not None and v.patch != self.patch:
            return v.patch > self.patch
        return _pre_key(v.pre) >= _pre_key(self.pre)

    def _caret(self, v: Version) -> bool:
        if v.major != self.major:
            return False
        if self.minor is None:
            return True
        if self.patch is None:
            return v.minor >= self.minor if self.major > 0 else v.minor == self.minor
        if self.major > 0:
            if v.minor != self.minor:
                return v.minor > self.minor
            if v.patch != self.patch:
                return v.patch > self.patch
        elif self.minor > 0:
            if v.minor != self.minor:
                return False
            if v.patch != self.patch:
                return v.patch > self.patch
        elif v.minor != self.minor or v.patch != self.patch:
            return False
        return _pre_key(v.pre) >= _pre_key(self.pre)

    def admits_pre_release_of(self, v: Version) -> bool:
        return bool(self.pre) and (self.major, self.minor, self.patch) == (v.major, v.minor, v.patch)


@dataclass(frozen=True)
class Requirement:
    text: str
    comparators: tuple[Comparator, ...]  # empty: any release ("*")

    def matches(self, version: Version | str) -> bool:
        v = parse_version(version) if isinstance(version, str) else version
        if not all(c.matches(v) for c in self.comparators):
            return False
        return not v.pre or any(c.admits_pre_release_of(v) for c in self.comparators)

    def __str__(self) -> str:
        return self.text


def parse_requirement(text: str) -> Requirement:
    """Parse a VersionReq; InvalidInput naming the text when it is not one."""
    if not isinstance(text, str):
        raise InvalidInput(f"version requirement must be a string, not {text!r}", subject=str(text))
    stripped = text.strip()
    if not stripped:
        raise InvalidInput("version requirement is empty", subject=text)
    comparators: list[Comparator] = []
    for part in stripped.split(","):
        part = part.strip()
        if not part:
            raise InvalidInput(f"version requirement {text!r} has an empty comparator", subject=text)
        if part in ("*", "x", "X"):
            continue
        comparators.append(_parse_comparator(part, text))
    return Requirement(stripped, tuple(comparators))


def _parse_comparator(part: str, text: str) -> Comparator:
    match = _COMPARATOR.fullmatch(part)
    if match is None:
        raise InvalidInput(
            f"version requirement {text!r}: {part!r} is not a comparator "
            f"(an operator {', '.join(OPERATORS)} or none, then a version like 1.2.3, 1.2 or 1.*)",
            subject=text,
        )
    op = match["op"] or "^"
    minor_text, patch_text = match["minor"], match["patch"]
    for number in (match["major"], minor_text, patch_text):
        if number and len(number) > 1 and number.startswith("0"):
            raise InvalidInput(f"version requirement {text!r}: {part!r} has a leading zero", subject=text)
    minor_wild = minor_text is not None and not minor_text.isdigit()
    patch_wild = patch_text is not None and not patch_text.isdigit()
    if minor_wild and patch_text is not None and not patch_wild:
        raise InvalidInput(
            f"version requirement {text!r}: {part!r} has a patch version after a wildcard", subject=text
        )
    if match["pre"] is not None and (patch_text is None or patch_wild):
        raise InvalidInput(
            f"version requirement {text!r}: {part!r} has a pre-release without a full version",
            subject=text,
        )
    if (minor_wild or patch_wild) and match["op"] is None:
        op = _WILDCARD
    return Comparator(
        op=op,
        major=int(match["major"]),
        minor=None if minor_text is None or minor_wild else int(minor_text),
        patch=None if patch_text is None or patch_wild else int(patch_text),
        pre=tuple(match["pre"].split(".")) if match["pre"] else (),
    )


def parse_version(text: str) -> Version:
    """An installed framework's version, read leniently (see module doc)."""
    if not isinstance(text, str):
        raise InvalidInput(f"version must be a string, not {text!r}", subject=str(text))
    stripped = text.strip().split("+", 1)[0]
    match = _VERSION_CORE.match(stripped)
    if match is None:
        raise InvalidInput(f"version {text!r} does not start with a number", subject=text)
    major, minor, patch = (int(g) if g else 0 for g in match.groups())
    rest = _POST_RELEASE.sub("", stripped[match.end():])
    if not rest:
        return Version(major, minor, patch)
    rest = rest[1:] if rest[0] in "-._" else rest
    # A PEP 440 suffix may carry its own post/dev part ("rc1.post2"): the
    # post part goes, the rest are identifiers.
    pre = tuple(p for p in re.split(r"[._]", rest) if p)
    if not pre or not all(_IDENTIFIER.fullmatch(p) for p in pre):
        raise InvalidInput(f"version {text!r} has an unreadable pre-release part {rest!r}", subject=text)
    return Version(major, minor, patch, pre)


def version_satisfies(version: str | Version, requirement: str | Requirement) -> bool:
    """Whether an installed ``version`` meets a carton's ``requirement``."""
    req = parse_requirement(requirement) if isinstance(requirement, str) else requirement
    return req.matches(version)
