"""Parsing of human sizes ("10G", "512MiB") and durations ("1h30m")."""

from __future__ import annotations

import re
from collections.abc import Callable

from cartonstore.errors import InvalidInput

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size(text: str) -> int:
    """'10G' / '10GiB' -> binary units; 'GB' -> decimal; a bare number is bytes."""
    _refuse_negative(text, "size", "512M, 10GiB, 1000000", parse_size)
    m = _SIZE_RE.match(text)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise InvalidInput(f"not a size: {text!r} (expected e.g. 512M, 10GiB, 1000000)")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def parse_duration(text: str) -> float:
    """'90' (seconds), '30m', '1h30m', '7d' -> seconds."""
    s = text.strip()
    _refuse_negative(s, "duration", "90, 30m, 1h30m, 7d", parse_duration)
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        return float(s)
    parts = _DURATION_RE.findall(s)
    if not parts or "".join(n + u for n, u in parts) != s:
        raise InvalidInput(f"not a duration: {text!r} (expected e.g. 90, 30m, 1h30m, 7d)")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


def _refuse_negative(text: str, what: str, examples: str, parse: Callable[[str], object]) -> None:
    """'-5G' is refused as negative, not as a mystery (or, on a command line, an option)."""
    rest = text.strip()
    if rest.startswith("-") and not rest.startswith("--"):
        try:
            parse(rest[1:])
        except InvalidInput:
            return
        raise InvalidInput(f"invalid {what} {text.strip()!r}: a {what} must be positive (e.g. {examples})")


def format_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]  # an int becomes a float of it
    raise AssertionError("unreachable")
