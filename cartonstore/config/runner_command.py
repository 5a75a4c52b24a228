"""Runner command templates: the configured argv with {placeholders}
(cartonstore.runner.protocol's PLACEHOLDERS) that the daemon fills per
model and instance. Pure; no I/O."""

from __future__ import annotations

import re

from cartonstore.errors import InvalidInput
from cartonstore.runner.protocol import PLACEHOLDERS

# "{{" and "}}" stand for literal braces, as in str.format; any other brace
# must open or close a placeholder.
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


def _scan(template: list[str]) -> list[tuple[int, re.Match[str]]]:
    if not isinstance(template, list) or not template or not all(isinstance(a, str) for a in template):
        raise InvalidInput(f"runner command must be a non-empty list of strings, not {template!r}")
    found = []
    for i, arg in enumerate(template):
        for m in _TOKEN.finditer(arg):
            token = m.group(0)
            if token in ("{{", "}}"):
                continue
            if m.group(1) is None:
                raise InvalidInput(f"runner command argument {arg!r}: unmatched {token!r} "
                                   "(write {{ or }} for a literal brace)")
            if m.group(1) not in PLACEHOLDERS:
                raise InvalidInput(f"runner command argument {arg!r}: unknown placeholder {{{m.group(1)}}}; "
                                   f"known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
            found.append((i, m))
    return found


def template_placeholders(template: list[str]) -> set[str]:
    """The placeholders a command template uses; raises InvalidInput for an
    unknown one or a stray brace (call it when reading the config)."""
    return {m.group(1) for _, m in _scan(template)}


def fill_argv(template: list[str], **values: str) -> list[str]:
    """The template with every placeholder replaced by its value. Values are
    inserted verbatim (never re-scanned), one argv element stays one; an
    argument that would start with '-' from a value (a name "-x") is
    refused, since the runner's option parser would read it as an option."""
    missing = sorted(template_placeholders(template) - values.keys())
    if missing:
        raise InvalidInput(f"runner command uses {', '.join('{' + m + '}' for m in missing)} "
                           "but no value is given for it")
    for i, m in _scan(template):
        if m.start() == 0 and str(values[m.group(1)]).startswith("-"):
            raise InvalidInput(f"runner command argument {template[i]!r} would be {str(values[m.group(1)])[:40]!r}, "
                               f"which a runner would read as an option")

    def replace(m: re.Match[str]) -> str:
        token = m.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        return str(values[m.group(1)])

    return [_TOKEN.sub(replace, arg) for arg in template]
