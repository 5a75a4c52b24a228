"""The import paths the README shows keep working from the folders'
__init__s, each in a fresh interpreter (a name that only resolves once
something else imported its module would pass in a shared one)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import cartonstore

PATHS = [
    ("cartonstore.store", "Store"),
    ("cartonstore.client", "model_path"),
    ("cartonstore.client", "Client"),
    ("cartonstore.client", "AsyncClient"),
    ("cartonstore.client", "InferClient"),
    ("cartonstore.runner", "main"),
    ("cartonstore.config", "load_config"),
    ("cartonstore.config", "Config"),
    ("cartonstore.cli", "main"),
    ("cartonstore.server.daemon", "Daemon"),
    ("cartonstore.fetch.puller", "Puller"),
    ("cartonstore.errors", "NotFound"),
    ("cartonstore", "CartonStoreError"),
]


@pytest.mark.parametrize(("module", "name"), PATHS, ids=[f"{m}.{n}" for m, n in PATHS])
def test_a_public_name_imports_from_its_folder(module: str, name: str) -> None:
    code = f"from {module} import {name} as x; print(getattr(x, '__module__', '') or type(x).__name__)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_importing_oci_plugs_nothing_into_fetch() -> None:
    """A Puller reads the kinds it is built with: importing the oci package
    changes no other Puller, and the standard set is the one place both
    kinds are named."""
    code = ("import cartonstore.oci; from cartonstore.config import standard_sources; "
            "from cartonstore.fetch.puller import CARTON_URL; from cartonstore.fetch.http.source_kinds import SourceKinds; "
            "ref = 'oci://r.example/m:v1'; "
            "print(SourceKinds((CARTON_URL,)).kind_for(ref), standard_sources().kind_for(ref).name)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["None", "oci"]


def _lazily_named_packages() -> list[Path]:
    return sorted(p for p in (Path(cartonstore.__file__).parent).glob("*/__init__.py")
                  if "lazy_names(__name__" in p.read_text())


@pytest.mark.parametrize("init", _lazily_named_packages(), ids=lambda p: p.parent.name)
def test_a_lazily_named_package_shows_mypy_the_names_it_serves(init: Path) -> None:
    """mypy reads a package's names from the imports under TYPE_CHECKING,
    the interpreter from lazy_names' table: both say the same names, each
    from the same module."""
    package = importlib.import_module(f"cartonstore.{init.parent.name}")
    checked = [(node.module, alias.name) for block in ast.parse(init.read_text()).body
               if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
               for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names]
    assert sorted(name for _, name in checked) == package.__all__
    for module, name in checked:
        assert getattr(package, name) is getattr(importlib.import_module(f"{package.__name__}.{module}"), name)
