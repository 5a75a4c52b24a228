"""Commands that never fetch import only what they need (issue 14).

`--help`, `path` of a model already built, `ls` and `inspect` of a local
carton run in real child processes under ``-X importtime``, which names every
module the process imported; none of them may load aiohttp or asyncio (the
fetcher), numpy (tensor decoding) or sqlite_utils (no longer used by the
index). `--help` imports neither the settings nor the store; the others do.
`path` and `ls` go further: they read the index and nothing else, so they
load no codec (zstandard, zlib), no hashing (hashlib), no zip reader, no
json (without --json), no ctypes (the blob writer's kernel hints), and no
shutil (argparse imports it for every parser unless told the terminal width).

No timer here: tests/bench/bench_cli.py measures the time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST

from cartonstore.store import Store

NOT_WANTED = ("aiohttp", "asyncio", "numpy", "sqlite_utils")
NOT_WANTED_TO_READ = (*NOT_WANTED, "json", "zstandard", "zlib", "hashlib", "ctypes", "shutil", "cartonstore.zipfmt.reader",
                      "cartonstore.format.manifest", "cartonstore.store.materialize.tree")
_LINE = re.compile(r"import time:\s+\d+ \|\s+\d+ \|( *)(\S+)")


def run_cli(*argv: str, cwd: Path) -> tuple[subprocess.CompletedProcess, list[tuple[int, str]]]:
    """Run the CLI in a child under -X importtime: its result, and every
    import as (depth, module) in the order -X importtime reports them (a
    module after the modules it imported)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARTONSTORE_")}
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "cartonstore.cli", *argv], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    imports = [(len(m[1]), m[2]) for m in map(_LINE.match, p.stderr.splitlines()) if m]
    p.stderr = "\n".join(line for line in p.stderr.splitlines() if not line.startswith("import time:"))
    return p, imports


def chain(imports: list[tuple[int, str]], index: int) -> str:
    """Who imported imports[index]: "numpy <- cartonstore.format.dtypes <- ... <- cartonstore.cli"."""
    depth, name = imports[index]
    names = [name]
    for d, n in imports[index + 1:]:
        if d < depth:
            names.append(n)
            depth = d
    return " <- ".join([*names, "cartonstore.cli"])  # depth 1: imported by the command's own module


def assert_lean(imports: list[tuple[int, str]], unwanted: tuple[str, ...] = NOT_WANTED) -> None:
    found = [chain(imports, i) for i, (_, name) in enumerate(imports) if name in unwanted]
    assert not found, "imported: " + "; ".join(found)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding the fixture carton, named demo, its model directory built."""
    root = tmp_path_factory.mktemp("imports") / "root"
    with Store(root) as s:
        s.add(FIXTURE_CARTON, name="demo")
        s.materialize("demo")
    return root


def test_help_imports_no_fetcher_and_no_numpy(tmp_path: Path) -> None:
    p, imports = run_cli("--help", cwd=tmp_path)
    assert p.returncode == 0 and "cartonstore path resnet" in p.stdout
    names = {n for _, n in imports}
    assert "cartonstore.cli.args" in names  # the check sees what the CLI imports...
    assert "cartonstore.config" not in names and "cartonstore.store" not in names  # ...and help needs no store
    assert_lean(imports)


def test_path_of_a_built_model_imports_no_fetcher_and_no_numpy(built: Path, tmp_path: Path) -> None:
    p, imports = run_cli("path", "demo", "--root", str(built), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"{built / 'models' / FIXTURE_DIGEST}\n"
    assert {"cartonstore.store.metadata.index", "cartonstore.store.store"} <= {n for _, n in imports}
    assert_lean(imports, NOT_WANTED_TO_READ)


def test_ls_imports_no_fetcher_and_no_numpy(built: Path, tmp_path: Path) -> None:
    p, imports = run_cli("ls", "--root", str(built), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(FIXTURE_DIGEST[:16]) and "demo" in p.stdout
    assert_lean(imports, NOT_WANTED_TO_READ)


def test_inspect_of_a_local_carton_imports_no_fetcher_and_no_numpy(tmp_path: Path) -> None:
    """The carton is read where it is (checked, its string tensors too), never added, and described."""
    shutil.copy(FIXTURE_CARTON, tmp_path / "local.carton")
    p, imports = run_cli("inspect", "./local.carton", "--root", str(tmp_path / "root"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == FIXTURE_DIGEST and "tensor_data" in p.stdout
    assert "cartonstore.carton.checks" in {n for _, n in imports}
    assert_lean(imports)


def test_path_of_a_built_model_answers_as_the_fetcher_does(tmp_path: Path) -> None:
    """The first `path` builds the model (through the fetcher), the second
    only finds it: same output, same closing progress event, last use
    touched (once it is older than TOUCH_AFTER; a use within it writes nothing)."""
    root = tmp_path / "root"
    with Store(root) as s:
        s.add(FIXTURE_CARTON, name="demo")

    def last_used(set_to: float | None = None) -> float:
        with sqlite3.connect(root / "index.db") as conn:
            if set_to is not None:
                conn.execute("UPDATE cartons SET last_used=?", (set_to,))
            return conn.execute("SELECT last_used FROM cartons").fetchone()[0]

    long_ago = time.time() - 3600
    last_used(long_ago)
    argv = ("path", "demo", "--root", str(root), "--json", "--progress", "json")
    first, _ = run_cli(*argv, cwd=tmp_path)
    assert last_used() > long_ago
    last_used(long_ago)
    second, second_imports = run_cli(*argv, cwd=tmp_path)
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    assert json.loads(first.stdout) == json.loads(second.stdout) == {
        "manifest_sha256": FIXTURE_DIGEST, "path": str(root / "models" / FIXTURE_DIGEST)}
    events = [{k: v for k, v in json.loads(p.stderr).items() if k != "seconds"} for p in (first, second)]
    assert events[0] == events[1] == {"event": "done", "bytes": 0, "total": None, "requests": 0, "retries": 0}
    touched = last_used()
    assert touched > long_ago
    assert_lean(second_imports)
    third, _ = run_cli(*argv, cwd=tmp_path)
    assert third.returncode == 0 and last_used() == touched, "used again within TOUCH_AFTER: nothing written"


@pytest.mark.parametrize("package", ["cartonstore.format", "cartonstore.zipfmt", "cartonstore.store"])
def test_every_lazy_name_is_its_modules(package: str) -> None:
    """A name listed in a package's lazy table resolves, to its module's own
    object (a misspelt or moved name would fail only where first used)."""
    import importlib

    module = importlib.import_module(package)
    assert module.__all__ and sorted(module.__all__) == module.__all__
    for name in module.__all__:
        value = getattr(module, name)
        owner = getattr(value, "__module__", None)
        if owner is not None and owner.startswith(package + "."):
            assert getattr(importlib.import_module(owner), name) is value


def test_a_lazy_name_may_not_be_a_submodule() -> None:
    from cartonstore.system.lazy_names import lazy_names

    with pytest.raises(ValueError, match=r"pkg: \['digest'\] name both a submodule"):
        lazy_names("pkg", {"digest": "digest is_sha256"})
