"""Checking a python model's requirements.txt against the packages the
runner's environment has installed.

Nothing is installed: a requirement the environment does not meet fails
the load with every unmet line listed, so the operator fixes the runner's
environment once instead of meeting the problems one import at a time.
The `packaging` library is used when it is there (full PEP 508 and PEP 440);
otherwise a small parser handles `name`, `name[extra]` and comparison
clauses (==, !=, >=, <=, >, <, ~=) on dotted numeric versions, and skips
lines with environment markers (it cannot evaluate them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

# Lines that name no installable-by-name package: pip options, file and URL
# requirements. They cannot be checked by name, so they are skipped.
_SKIPPED_PREFIXES = ("-", "git+", "hg+", "svn+", "bzr+", "http://", "https://", "file:", ".", "/")
_SIMPLE = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?P<spec>(?:[<>=!~]=?|===)[^;]*)?\s*(?:;.*)?"
)
_CLAUSE = re.compile(r"\s*(===|==|!=|>=|<=|~=|>|<)\s*([^\s,]+)\s*")


@dataclass(frozen=True)
class Unmet:
    """One requirement the environment does not satisfy."""

    line: str
    installed: str | None  # the installed version, None when not installed

    def describe(self) -> str:
        if self.installed is None:
            return f"{self.line} (not installed)"
        return f"{self.line} (installed: {self.installed})"


def _requirement_lines(text: str) -> list[str]:
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line and not line.startswith(_SKIPPED_PREFIXES) and " @ " not in line:
            lines.append(line)
    return lines


def _installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _check_with_packaging(line: str) -> Unmet | bool | None:
    """Unmet/None with `packaging`; False when it is not available."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:
        return False
    try:
        requirement = Requirement(line)
    except InvalidRequirement as exc:
        raise ValueError(f"requirements.txt line {line!r} is not a valid requirement: {exc}") from None
    if requirement.marker is not None and not requirement.marker.evaluate():
        return None  # for another platform or python
    installed = _installed_version(requirement.name)
    if installed is None:
        return Unmet(line, None)
    if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
        return Unmet(line, installed)
    return None


def _numeric(version: str) -> tuple[int, ...]:
    parts = []
    for piece in re.split(r"[.+-]", version):
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match.group()))
    return tuple(parts)


def _clause_holds(op: str, wanted: str, installed: str) -> bool:
    if op == "===":
        return installed == wanted
    if wanted.endswith(".*") and op in ("==", "!="):
        prefix = _numeric(wanted[:-2])
        same = _numeric(installed)[: len(prefix)] == prefix
        return same if op == "==" else not same
    have, want = _numeric(installed), _numeric(wanted)
    width = max(len(have), len(want))
    have, want = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    if op == "~=":
        prefix = _numeric(wanted)[:-1]
        return have >= want and _numeric(installed)[: len(prefix)] == prefix
    return {"==": have == want, "!=": have != want, ">=": have >= want, "<=": have <= want,
            ">": have > want, "<": have < want}[op]


def _check_simply(line: str) -> Unmet | None:
    if ";" in line:
        # An environment marker this parser cannot evaluate: the line may be
        # for another platform, so it is not held against this one.
        return None
    match = _SIMPLE.fullmatch(line)
    if match is None:
        raise ValueError(f"requirements.txt line {line!r} is not a requirement this runner can check")
    installed = _installed_version(match.group("name"))
    if installed is None:
        return Unmet(line, None)
    spec = (match.group("spec") or "").strip()
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        parsed = _CLAUSE.fullmatch(clause)
        if parsed is None:
            raise ValueError(f"requirements.txt line {line!r}: cannot read version clause {clause!r}")
        if not _clause_holds(parsed.group(1), parsed.group(2), installed):
            return Unmet(line, installed)
    return None


def unmet_requirements(text: str, *, use_packaging: bool = True) -> list[Unmet]:
    """Every requirement in requirements.txt ``text`` that the installed
    packages do not satisfy. Raises ValueError for a line it cannot read."""
    unmet: list[Unmet] = []
    for line in _requirement_lines(text):
        result = _check_with_packaging(line) if use_packaging else False
        if result is False:
            result = _check_simply(line)
        if result is not None:
            unmet.append(result)  # type: ignore[arg-type]  # neither False nor None: an Unmet
    return unmet


def check_requirements_file(path: Path) -> list[Unmet]:
    """unmet_requirements of a file; [] when there is no such file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return unmet_requirements(text)
