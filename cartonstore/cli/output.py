"""What a command prints: lines for a person, or one JSON document with --json."""

from __future__ import annotations

from typing import Any, Sequence


def print_json(data: object) -> None:
    import json  # here, not at the top: `path` and `ls` without --json never need it (issue 14)

    print(json.dumps(data, indent=2, sort_keys=True))


class Output:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def emit(self, data: dict[str, Any], lines: Sequence[str]) -> None:
        if self.as_json:
            print_json(data)
        else:
            for line in lines:
                print(line)
