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


def test_importing_oci_plugs_nothing_into_fetch() -> None:
    """A Puller reads the kinds it is built with: importing the oci package
    changes no other Puller, and the standard set is the one place both
    kinds are named."""
    code = ("import cartonstore.oci; from cartonstore.config import standard_sources; "
            "from cartonstore.fetch.puller import CARTON_URL; from cartonstore.fetch.source_kinds import SourceKinds; "
            "ref = 'oci://r.example/m:v1'; "
            "print(SourceKinds((CARTON_URL,)).kind_for(ref), standard_sources().kind_for(ref).name)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["None", "oci"]
