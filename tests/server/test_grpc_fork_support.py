"""grpcio's fork handlers are off in the daemon: on in grpcio's core unless
GRPC_ENABLE_FORK_SUPPORT says no when grpcio is first imported, they made a
runner forked while gRPC's threads were busy die with SIGSEGV before its
exec (a load failing now and then, under load). Any module of the daemon
may be the first to import grpcio (tritonclient.grpc's messages are read by
the model service), so the setting must be in place before each of them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import os, sys
seen = []
class Finder:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" and not seen:
            seen.append(os.environ.get("GRPC_ENABLE_FORK_SUPPORT"))
        return None
sys.meta_path.insert(0, Finder())
import importlib
importlib.import_module(sys.argv[1])
import grpc   # here, if nothing before did
print(seen[0])
"""


@pytest.mark.parametrize("first", ["cartonstore.server.daemon", "cartonstore.server.models.load_params",
                                   "cartonstore.server.inference.pipeline", "cartonstore.server.rpc"])
def test_grpc_is_first_imported_with_its_fork_handlers_off(first: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    got = subprocess.run([sys.executable, "-c", PROBE, first], env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "false", got.stdout
