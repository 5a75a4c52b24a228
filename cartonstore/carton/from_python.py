"""A carton made from a python model: `cartonstore pack --python
entry.py:get_model --example x=x.npy -o m.carton`.

The directory holding entry.py becomes the carton's model/ (so the model
may import its neighbours; __pycache__ and hidden files are left out), run
by the python runner (entrypoint_package = entry, entrypoint_fn =
get_model). The model is run once on the example inputs, in a child
process through the python runner's own loading, and the run is what
carton.toml records: each input and output with the dtype and shape it
had, the first dimension a shared symbol "batch" when every tensor has
one of the same size, and the run itself as a [[self_test]].
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cartonstore.errors import InvalidInput

from .example_run import declarations, recorded_self_test, run_on_examples

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_entry(entry: str) -> tuple[Path, str]:
    """``path/entry.py:get_model`` -> (the file, the function's name)."""
    file_text, sep, fn = entry.rpartition(":")
    path = Path(file_text)
    if not sep or not _IDENTIFIER.fullmatch(fn) or path.suffix != ".py" or not _IDENTIFIER.fullmatch(path.stem):
        raise InvalidInput(f"--python {entry!r}: expected FILE.py:FUNCTION (model.py:get_model)", subject=entry)
    if not path.is_file():
        raise InvalidInput(f"--python {entry!r}: {path} is not a file", subject=entry)
    return path, fn


def python_carton_dir(entry: str, work: Path, *, name: str | None, examples: Mapping[str, Path]) -> Path:
    """An unpacked carton in ``work`` (made here) for the python model ``entry``."""
    import tomli_w

    path, fn = parse_entry(entry)
    # links are kept as links (pack refuses one that leaves the directory), not followed out of it
    shutil.copytree(path.parent, work / "model", symlinks=True, ignore=shutil.ignore_patterns("__pycache__", ".*"))
    opts = {"entrypoint_package": path.stem, "entrypoint_fn": fn}
    inputs, outputs = run_on_examples("python", work, opts, examples, f"--python {entry}")
    toml: dict[str, Any] = {
        "spec_version": 1, "model_name": name or path.stem, **declarations(inputs, outputs),
        "self_test": [recorded_self_test(work / "tensor_data", inputs, outputs)],
        "runner": {"runner_name": "python",
                   "required_framework_version": f">={sys.version_info.major}.{sys.version_info.minor}",
                   "runner_compat_version": 1, "opts": opts},
    }
    (work / "carton.toml").write_text(tomli_w.dumps(toml))
    return work
