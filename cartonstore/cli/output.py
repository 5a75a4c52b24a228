"""What a command prints: lines for a person, or one JSON document with --json."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cartonstore.carton.writer import WrittenCarton


def print_json(data: object) -> None:
    import json  # here, not at the top: `path` and `ls` without --json never need it

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

    def written(self, w: WrittenCarton) -> None:
        """What export and pack say of the carton file they wrote."""
        from cartonstore.format.units import format_size

        self.emit({"manifest_sha256": w.digest, "path": str(w.path), "files_inline": w.files_inline,
                   "files_linked": w.files_linked, "size": w.size},
                  [f"wrote {w.path} ({format_size(w.size)}, {w.files_inline} file(s) inline, "
                   f"{w.files_linked} linked)", w.digest])
