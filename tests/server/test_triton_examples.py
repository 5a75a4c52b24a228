"""Triton's own model-control examples (tests/fixtures/triton_examples/,
as Triton's client repository ships them) run as scripts against a real
daemon, over HTTP and over gRPC, with the model they expect: "simple",
INT32 INPUT0 and INPUT1 of [batch, 16] to OUTPUT0 = sum and OUTPUT1 =
difference, batching up to 8 rows (its carton's own max_batch_size)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.daemonkit import DaemonProcess, call
from kit.runnerkit import carton_toml

from cartonstore.cli.commands import main

EXAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "triton_examples"

SIMPLE_MAIN = '''
class Simple:
    def infer_with_tensors(self, tensors):
        a, b = tensors["INPUT0"], tensors["INPUT1"]
        return {"OUTPUT0": a + b, "OUTPUT1": a - b}


def get_model():
    return Simple()
'''


def simple_carton(dest: Path) -> Path:
    (dest / "model").mkdir(parents=True)
    pair = [("{}0", "int32", ["batch", 16]), ("{}1", "int32", ["batch", 16])]
    (dest / "carton.toml").write_text(carton_toml(
        "python", ">=3.8", {"entrypoint_package": "main", "entrypoint_fn": "get_model", "max_batch_size": 8},
        model_name="simple", inputs=[(n.format("INPUT"), t, s) for n, t, s in pair],
        outputs=[(n.format("OUTPUT"), t, s) for n, t, s in pair]))
    (dest / "model" / "main.py").write_text(SIMPLE_MAIN)
    return dest


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("examples")
    root = base / "root"
    carton = simple_carton(base / "simple")
    # the HTTP example wants seven models in the repository, the gRPC one eight: names of one carton
    for name in ("simple", "a", "b", "c", "d", "e", "f"):
        assert main(["add", str(carton), "--name", name, "--root", str(root), "--progress", "none"]) == 0
    d = DaemonProcess(root, extra_args=["--grpc-listen", "127.0.0.1:0"]).start()
    yield d
    d.stop()


def run_example(script: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLES / script), "-u", url], capture_output=True, text=True,
                          timeout=120)


def test_the_http_and_grpc_model_control_examples_pass(served: DaemonProcess) -> None:
    http = run_example("simple_http_model_control.py", served.host_port)
    assert (http.returncode, http.stdout.strip()) == (0, "PASS: model control"), http.stderr
    assert main(["add", str(served.root.parent / "simple"), "--name", "g", "--root", str(served.root),
                 "--progress", "none"]) == 0
    grpc = run_example("simple_grpc_model_control.py", served.grpc_host_port)
    assert (grpc.returncode, grpc.stdout.strip()) == (0, "PASS: model control"), grpc.stdout + grpc.stderr
    _, index = call(served, "POST", "/v2/repository/index", json={})
    assert [row["state"] for row in index if row["name"] == "simple"] == ["UNAVAILABLE"]   # each unloads it last
