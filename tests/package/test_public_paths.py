"""The import paths the README shows keep working from the folders'
__init__s, each in a fresh interpreter (a name that only resolves once
something else imported its module would pass in a shared one)."""

from __future__ import annotations

import subprocess
import sys

import pytest

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


def test_oci_references_are_plugged_into_fetch_by_importing_oci() -> None:
    """fetch names no oci module: the oci package registers its source kind
    when imported, and before that no kind claims an oci:// reference."""
    code = ("from cartonstore.fetch.hooks import source_kind_for as k; ref = 'oci://r.example/m:v1'; "
            "before = k(ref); import cartonstore.oci; print(before is None, k(ref).name)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "oci"]
