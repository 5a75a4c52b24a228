"""WWW-Authenticate challenges (RFC 7235), as registries send them. Pure.

    Bearer realm="https://auth.example/token",service="registry",scope="repository:a/b:pull"
    Basic realm="Registry Realm"

A header may hold several challenges; each is a scheme then comma-separated
``name=value`` parameters whose values are tokens or quoted strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_PARAM = re.compile(rf'\s*({_TOKEN})\s*=\s*(?:"((?:[^"\\]|\\.)*)"|({_TOKEN}))\s*(?:,|$)')
_SCHEME = re.compile(rf"\s*,?\s*({_TOKEN})(?:\s+|$)")


@dataclass(frozen=True)
class Challenge:
    scheme: str                       # lowercase: "bearer", "basic"
    params: dict[str, str] = field(default_factory=dict)   # names lowercase

    @property
    def realm(self) -> str | None:
        return self.params.get("realm")


def parse_challenges(header: str) -> list[Challenge]:
    """Every challenge in a WWW-Authenticate value, in order; whatever cannot
    be read ends the list (a caller then finds no usable challenge)."""
    out: list[Challenge] = []
    pos = 0
    while pos < len(header):
        m = _SCHEME.match(header, pos)
        if m is None:
            break
        scheme, pos = m.group(1).lower(), m.end()
        params: dict[str, str] = {}
        while (p := _PARAM.match(header, pos)) is not None:
            value = p.group(2) if p.group(2) is not None else p.group(3)
            params[p.group(1).lower()] = re.sub(r"\\(.)", r"\1", value)
            pos = p.end()
        out.append(Challenge(scheme, params))
    return out
