"""The doubler: a user-written runner of a few lines on the runner SDK,
its carton, and how tests start it and talk to it (test_runner_sdk.py,
test_runner_lifecycle.py: each makes doubler_root its module's
doubler_dir fixture)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from conftest import short_dir

from cartonstore.v2.framing import encode_infer_request, parse_infer_response

from .runnerkit import carton_toml, processes_with, start_runner, unix_request, wait_gone

HCL = "Inference-Header-Content-Length"

DOUBLER = '''\
import time
from cartonstore.runner import InferResult, LoadError, main


class Doubler:
    def infer(self, inputs, parameters):
        if "started" in parameters:   # a file the test waits for: the model computes now
            open(parameters["started"], "w").close()
        if "sleep" in parameters:
            time.sleep(parameters["sleep"])
        if parameters.get("raise"):
            raise KeyError("asked to raise")
        outputs = {"y": inputs["x"] * 2, "n": inputs["x"].shape[0]}
        if parameters.get("with_parameters"):
            return InferResult(outputs, {"seen": sorted(parameters)})
        return outputs


def load(ctx):
    if ctx.opts.get("refuse"):
        raise LoadError("refused: opts say so")
    if ctx.opts.get("explode"):
        1 / 0
    return Doubler()


main(load)
'''


def assert_none_left(marker: str, but: str | None = None) -> None:
    pids = processes_with(marker)
    if but is not None:
        pids = [pid for pid in pids if but not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")]
    left = [pid for pid in pids if not wait_gone(pid, 5)]
    assert not left, f"runner processes left behind: {left}"


def doubler_root() -> Iterator[Path]:
    """The runner script, its carton and the runners' sockets (hence short:
    see conftest.short_dir)."""
    with short_dir() as root:
        (root / "doubler.py").write_text(DOUBLER)
        model = root / "carton"
        model.mkdir()
        (model / "carton.toml").write_text(carton_toml(
            "doubler", "*", {"answer": 42}, inputs=[("x", "float32", ["N"])],
            outputs=[("y", "float32", ["N"]), ("n", "int64", [])]))
        yield root


def start(doubler_dir: Path, label: str, opts: dict[str, Any] | None = None,
          **kw: Any) -> tuple[subprocess.Popen, Path]:
    sock = doubler_dir / f"{label}.sock"
    proc = start_runner(str(doubler_dir / "doubler.py"), doubler_dir / "carton", sock, opts=opts, **kw)
    return proc, sock


def post(sock: Path, body: bytes, headers: dict[str, str] | None = None,
         path: str = "/v2/models/dbl/infer") -> tuple[int, dict[str, str], bytes]:
    return unix_request(sock, "POST", path, body, headers)


def infer(sock: Path, inputs: dict[str, np.ndarray], path: str = "/v2/models/dbl/infer",
          **kw: Any) -> tuple[dict, dict[str, np.ndarray]]:
    parts, header_length = encode_infer_request(inputs, **kw)
    status, headers, body = post(sock, b"".join(parts), {HCL: str(header_length)} if header_length else {}, path)
    assert status == 200, body
    length = headers.get(HCL)
    return parse_infer_response(body, int(length) if length else None)
