"""A line that silences ruff or mypy names the check and says why, on the
line: "# noqa: CODE - reason", "# type: ignore[code]  # reason". A bare
noqa or ignore silences whatever comes next too, and one without its
reason cannot be judged when the code around it changes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRAGMA = re.compile(r"#\s*(noqa|type:\s*ignore)\b")
NAMED = re.compile(r"[#] noqa: [A-Z]+[0-9]+(, [A-Z]+[0-9]+)* - \S|[#] type: ignore\[[a-z-]+(, [a-z-]+)*\]  # \S")


def _unexplained(folder: str) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if PRAGMA.search(line) and not NAMED.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


@pytest.mark.parametrize("folder", ["cartonstore", "tests"])
def test_every_noqa_and_type_ignore_names_its_code_and_says_why(folder: str) -> None:
    assert _unexplained(folder) == []
