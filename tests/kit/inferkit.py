"""Cartons that run, for the daemon's inference tests: a python echo model
over every carton dtype (with inputs that make it crash or hang on
purpose), an ONNX model built with onnx.helper, and runner processes
found in /proc."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cartonstore.carton.pack import pack_directory
from kit.daemonkit import DaemonProcess, call
from kit.prockit import live_pids
from kit.runnerkit import carton_toml, onnx_model_dir

NUMERIC = ["float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
DTYPES = [*NUMERIC, "string"]

ECHO_MAIN = '''
import os
import time

import numpy as np


class Echo:
    def infer_with_tensors(self, tensors):
        x = tensors.get("x_float32")
        if x is not None and x.size and x.flat[0] == -1:
            os._exit(3)                  # crash on request
        if x is not None and x.size and x.flat[0] == -2:
            time.sleep(3600)             # hang on request
        return {"y_" + name[2:]: value for name, value in tensors.items()}


def get_model():
    {startup}
    return Echo()
'''


def echo_toml(model_name: str = "echo", dtypes: list[str] | None = None, runner: str = "python",
              requirement: str = ">=3.8") -> str:
    dtypes = dtypes or DTYPES
    lines = [f'spec_version = 1\nmodel_name = "{model_name}"\n']
    for role, prefix in (("input", "x"), ("output", "y")):
        for dt in dtypes:
            lines.append(f'[[{role}]]\nname = "{prefix}_{dt}"\ndtype = "{dt}"\nshape = ["n", "*"]\n')
    lines.append(f'[runner]\nrunner_name = "{runner}"\nrequired_framework_version = "{requirement}"\n'
                 'runner_compat_version = 1\n[runner.opts]\nentrypoint_package = "main"\n'
                 'entrypoint_fn = "get_model"\n')
    return "\n".join(lines)


def echo_carton(dest: Path, *, label: str = "v1", startup: str = "pass", **toml: object) -> Path:
    """An unpacked python-runner carton that echoes x_<dtype> to y_<dtype>.
    label changes its bytes (a new version); startup runs in get_model()."""
    (dest / "model").mkdir(parents=True, exist_ok=True)
    (dest / "carton.toml").write_text(echo_toml(**toml))  # type: ignore[arg-type]  # echo_toml's keywords
    (dest / "model" / "main.py").write_text(ECHO_MAIN.replace("{startup}", startup) + f"\nLABEL = {label!r}\n")
    return dest


def repeat_carton(dest: Path, name: str, main_py: str, out_dtype: str = "int32", out_len: int = 1,
                  in_shape: list[int | str] | None = None) -> Path:
    """A decoupled model's python carton (``main_py`` its model/main.py):
    input IN (int32), outputs OUT (``out_len`` of ``out_dtype``) and IDX (uint32[1])."""
    (dest / "model").mkdir(parents=True)
    (dest / "carton.toml").write_text(carton_toml(
        "python", ">=3.8", {"entrypoint_package": "main", "entrypoint_fn": "get_model"}, model_name=name,
        inputs=[("IN", "int32", in_shape or ["n"])], outputs=[("OUT", out_dtype, [out_len]), ("IDX", "uint32", [1])]))
    (dest / "model" / "main.py").write_text(main_py)
    return dest


def onnx_carton(dest: Path) -> Path:
    """y = x * 2 + 1 on float32 [n, 4] (x its one input), run by onnxruntime on one thread."""
    return onnx_model_dir(dest.parent, name=dest.name, ids=False, opts={"intra_op_num_threads": 1})


def packed(src: Path, out: Path) -> Path:
    pack_directory(src, out)
    return out


def sample(dtype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    count = int(np.prod(shape))
    if dtype == "string":
        return np.array([f"s{i}-\u00e9".encode() for i in range(count)], dtype=object).reshape(shape)
    return (np.arange(count) % 100).astype(dtype).reshape(shape)


def runner_pids(root: Path) -> list[int]:
    """Processes whose command line names this store's runner sockets."""
    return live_pids(str(root / "run" / "runners"))


def in_flight(d: DaemonProcess, model: str) -> int:
    """Infer requests ``d`` has sent to ``model``'s runners and not yet had
    answered (cartonstore_runner_outstanding): a test waits for one to be
    under way before it does something to it."""
    text = call(d, "GET", "/metrics")[1]
    return sum(int(float(line.split()[-1])) for line in text.splitlines()
               if line.startswith(f'cartonstore_runner_outstanding{{model="{model}",'))


def spares_run(root: Path) -> bool:
    """Every pre-warmed spare's runner process runs: the daemon counts a
    spare once spawned, and its runner is a process a moment later (after
    the sandbox's steps: confine, then bwrap and its init, each an exec or
    a fork)."""
    slots = root / "run" / "slots"
    names = [name for name in os.listdir(slots) if "-spare-" in name] if slots.is_dir() else []
    return all(any(_is_runner(pid) for pid in live_pids(str(slots / name))) for name in names)


def _is_runner(pid: int) -> bool:
    """The process runs a runner module itself: its first ``-m`` names one
    (a confine or bwrap step before it has the runner's command line as
    arguments, after a module of its own or none)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:   # gone meanwhile
        return False
    if b"-m" not in argv:
        return False
    module = argv.index(b"-m") + 1
    return module < len(argv) and argv[module].startswith(b"cartonstore.runner.")


def runner_sockets(root: Path) -> list[Path]:
    """Every daemon's runner sockets in this store (each daemon has a directory of its own)."""
    return sorted((root / "run" / "runners").glob("*/*.sock"))


def third_party_config(base: Path, runner_name: str, source: str, args: Sequence[str]) -> Path:
    """A daemon config (written in ``base``) whose [runners.<runner_name>]
    runs the Python ``source``, saved beside it, with ``args`` (placeholders
    and all)."""
    script = base / f"{runner_name}.py"
    script.write_text(source)
    config = base / "cartonstore.toml"
    command = json.dumps(["{python}", str(script), *args])   # a JSON array of strings is a TOML array
    config.write_text(f'[runners.{runner_name}]\ncommand = {command}\nframework_version = "1.0.0"\n')
    return config


def third_party_runner(infer: str) -> str:
    """The source of a third-party v2 runner: aiohttp on the Unix socket its
    first argument names, ready at once, answering infer with the
    ``async def infer(request)`` that ``infer`` defines (json and web imported)."""
    return ("import json, sys\nfrom aiohttp import web\n\nasync def ready(request):\n    return web.Response()\n\n"
            + infer.strip() + "\n\napp = web.Application(client_max_size=1 << 30)\n"
            'app.router.add_get("/v2/health/ready", ready)\n'
            'app.router.add_post("/v2/models/{name}/infer", infer)\n'
            "web.run_app(app, path=sys.argv[1], print=None)\n")
