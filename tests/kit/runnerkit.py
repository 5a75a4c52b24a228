"""Test cartons for runners and helpers to run runner processes directly.

* ``python_echo_model_dir``: a carton for the built-in python runner whose
  model echoes every input as the output of the same name, with variants
  for what goes wrong (exit at start, never ready, raise at load, and per
  request: raise, crash, hang, garbage). Without declared tensors, magic
  inputs pick the per-request behaviour: ``__raise__``, ``__crash__``,
  ``__sleep__`` (seconds) and ``__garbage__``.
* ``onnx_model_dir``: y = x * 2 + 1 (float32 [N, 4]) and ids -> ids_out
  (int64 Identity), built with onnx.helper.
* ``torchscript_model_dir``: the same maths as TorchScript (needs torch).
* ``pack_dir``: a directory -> .carton with cartonstore's pack library.
* ``start_runner`` / ``wait_ready`` / ``stop_runner`` / ``runner_session`` /
  ``unix_get``: real runner processes on real Unix sockets.
* ``processes_with``: live processes whose command line holds a marker
  (tests assert none is left).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from cartonstore.carton.pack import pack_directory
from cartonstore.client.wire import UnixHTTPConnection
from cartonstore.runner.builtin_runners import BUILTIN_RUNNERS
from kit.prockit import live_pids, wait_gone  # noqa: F401 - wait_gone is used by the tests through this kit

PY = sys.executable

# Every carton dtype, each as an echo input/output of shape [N, 2] or [N].
ALL_CARTON_DTYPES = ("float32", "float64", "string", "int8", "int16", "int32", "int64",
                     "uint8", "uint16", "uint32", "uint64")

TensorDecl = tuple[str, str, Any]  # name, carton dtype, shape (None, str or list)


# -- carton.toml ------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def carton_toml(runner_name: str, framework: str, opts: dict[str, Any] | None = None, *,
                model_name: str = "test-model", inputs: Sequence[TensorDecl] | None = None,
                outputs: Sequence[TensorDecl] | None = None) -> str:
    lines = ["spec_version = 1", f"model_name = {_toml_value(model_name)}", ""]
    for key, decls in (("input", inputs), ("output", outputs)):
        for name, dtype, shape in decls or ():
            lines += [f"[[{key}]]", f"name = {_toml_value(name)}", f"dtype = {_toml_value(dtype)}"]
            if shape is not None:
                lines.append(f"shape = {_toml_value(shape)}")
            lines.append("")
    lines += ["[runner]", f"runner_name = {_toml_value(runner_name)}",
              f"required_framework_version = {_toml_value(framework)}", "runner_compat_version = 1", ""]
    if opts:
        lines.append("[runner.opts]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in opts.items()]
    return "\n".join(lines) + "\n"


# -- python echo model ------------------------------------------------------

_ECHO_MODEL = '''\
import os
import sys
import time

import numpy as np

ON_LOAD = {on_load!r}
ON_INFER = {on_infer!r}


class EchoModel:
    def infer_with_tensors(self, tensors):
        tensors = dict(tensors)
        action, argument = ON_INFER, None
        for key in ("__raise__", "__crash__", "__sleep__", "__garbage__"):
            if key in tensors:
                action, argument = key.strip("_"), tensors.pop(key)
        if action == "raise":
            raise ValueError("the model was asked to raise")
        if action == "crash":
            sys.stderr.write("echo model: crashing on request\\n")
            sys.stderr.flush()
            os._exit(17)
        if action == "hang":
            time.sleep(3600)
        if action == "sleep":
            time.sleep(float(np.asarray(argument).reshape(-1)[0]))
        if action == "garbage":
            return ["not", "a", "dict"]
        return tensors


def get_model():
    if ON_LOAD == "exit":
        sys.stderr.write("echo model: exiting at start\\n")
        sys.stderr.flush()
        os._exit(5)
    if ON_LOAD == "never_ready":
        time.sleep(3600)
    if ON_LOAD == "raise":
        raise RuntimeError("the model refuses to load")
    return EchoModel()
'''


def all_dtype_decls() -> list[TensorDecl]:
    """One echo tensor per carton dtype: "t_<dtype>" of shape ["N", 2]."""
    return [(f"t_{dtype}", dtype, ["N", 2]) for dtype in ALL_CARTON_DTYPES]


def python_echo_model_dir(tmp: Path, *, name: str = "echo", on_load: str = "ok", on_infer: str = "echo",
                          declare: Sequence[TensorDecl] | None = None, requirements: str | None = None,
                          framework: str = ">=3.8", opts: dict[str, Any] | None = None) -> Path:
    """An unpacked python carton at tmp/name. ``on_load``: "ok", "exit",
    "never_ready", "raise". ``on_infer``: "echo", "raise", "crash", "hang",
    "garbage". ``declare``: inputs (echoed as outputs of the same names);
    None declares no tensors."""
    root = tmp / name
    package = root / "model" / "echo_model"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(_ECHO_MODEL.format(on_load=on_load, on_infer=on_infer))
    if requirements is not None:
        (root / "model" / "requirements.txt").write_text(requirements)
    all_opts = {"entrypoint_package": "echo_model", "entrypoint_fn": "get_model", **(opts or {})}
    (root / "carton.toml").write_text(carton_toml("python", framework, all_opts, model_name=name,
                                                  inputs=declare, outputs=declare))
    return root


# -- onnx and torchscript models --------------------------------------------

ONNX_DECLS_IN: list[TensorDecl] = [("x", "float32", ["N", 4]), ("ids", "int64", ["N"])]
ONNX_DECLS_OUT: list[TensorDecl] = [("y", "float32", ["N", 4]), ("ids_out", "int64", ["N"])]


def onnx_model_dir(tmp: Path, *, name: str = "affine", model_file: str | None = None, ids: bool = True,
                   opts: dict[str, Any] | None = None) -> Path:
    """y = x * 2 + 1 on float32 [N, 4]; with ids, also ids_out = Identity(ids)
    on int64 [N] (without, x is the one input, as a raw binary request needs)."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Mul", ["x", "two"], ["doubled"]), helper.make_node("Add", ["doubled", "one"], ["y"])]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])]
    if ids:
        nodes.append(helper.make_node("Identity", ["ids"], ["ids_out"]))
        ins.append(helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"]))
        outs.append(helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["N"]))
    graph = helper.make_graph(nodes, "affine", ins, outs,
                              [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
                               helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # readable by any onnxruntime from 1.10 on
    onnx.checker.check_model(model)
    root = tmp / name
    path = root / "model" / (model_file or "model.onnx")
    path.parent.mkdir(parents=True)
    path.write_bytes(model.SerializeToString())
    opts = {**(opts or {}), **({"model_file": model_file} if model_file else {})}
    (root / "carton.toml").write_text(carton_toml("onnx", ">=1.10", opts, model_name=name,
                                                  inputs=ONNX_DECLS_IN[:2 if ids else 1],
                                                  outputs=ONNX_DECLS_OUT[:2 if ids else 1]))
    return root


_TORCH_MODULE = '''
import torch
from typing import Dict

class Affine(torch.nn.Module):
    def forward(self, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        return {"y": inputs["x"] * 2 + 1, "ids_out": inputs["ids"].clone()}
'''


def save_scripted(source: str, class_name: str, dest: Path) -> Path:
    """torch.jit.script of ``class_name()`` from the python ``source``, saved
    at ``dest`` (TorchScript reads a module's source from its file, so the
    source is written beside it first). Needs torch."""
    import importlib.util

    import torch

    dest.parent.mkdir(parents=True, exist_ok=True)
    module_file = dest.parent / f"_{dest.stem.replace('-', '_')}_{class_name.lower()}_src.py"
    module_file.write_text(source)
    spec = importlib.util.spec_from_file_location(module_file.stem, module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]  # a file path always has its loader
    torch.jit.script(getattr(module, class_name)()).save(str(dest))
    module_file.unlink()   # not part of the carton
    return dest


def torchscript_model_dir(tmp: Path, *, name: str = "affine-pt") -> Path:
    """The onnx model's maths as TorchScript (Carton's dict convention).
    Needs torch importable in this python."""
    root = tmp / name
    save_scripted(_TORCH_MODULE, "Affine", root / "model" / "model.pt")
    (root / "carton.toml").write_text(carton_toml("torchscript", ">=2.0", None, model_name=name,
                                                  inputs=ONNX_DECLS_IN, outputs=ONNX_DECLS_OUT))
    return root


def pack_dir(directory: Path, out: Path) -> Path:
    """``cartonstore pack`` of ``directory`` into the .carton file ``out``."""
    pack_directory(directory, out)
    return out


# -- runner processes -------------------------------------------------------


def runner_argv(kind: str, model_dir: Path, socket_path: Path, *, name: str = "m", version: str = "1",
                opts: dict[str, Any] | None = None, devices: str = "cpu") -> list[str]:
    """The argv the daemon would run: a built-in kind ("python", "onnx",
    "torchscript") or the path of a runner script."""
    values = {"model_dir": str(model_dir), "socket": str(socket_path), "name": name, "version": version,
              "opts": json.dumps(opts or {}), "devices": devices}
    if kind in BUILTIN_RUNNERS:
        return [arg.format(**values) for arg in BUILTIN_RUNNERS[kind]]
    return [PY, str(kind), "--model-dir", values["model_dir"], "--socket", values["socket"], "--name", name,
            "--version", version, "--opts", values["opts"], "--devices", devices]


def start_runner(kind: str, model_dir: Path, socket_path: Path, *, env: dict[str, str] | None = None,
                 **kwargs: Any) -> subprocess.Popen:
    """A runner process (stderr piped; read it with stop_runner); ``env`` adds to this process's."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.Popen(runner_argv(kind, model_dir, socket_path, **kwargs), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def runner_infer(sock: Path, inputs: dict[str, Any], **kw: Any) -> tuple[int, Any]:
    """One v2 infer straight to a runner's socket (encode_infer_request's
    keywords): (status, (doc, outputs)) on 200, else (status, error JSON)."""
    from cartonstore.v2.framing import encode_infer_request, parse_infer_response

    parts, header_length = encode_infer_request(inputs, **kw)
    hcl = "Inference-Header-Content-Length"
    status, headers, body = unix_request(sock, "POST", "/v2/models/m/infer", b"".join(parts),
                                         {hcl: str(header_length)} if header_length else {})
    if status != 200:
        return status, json.loads(body)
    length = headers.get(hcl)
    return status, parse_infer_response(body, int(length) if length else None)


def unix_request(socket_path: Path, method: str, path: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """One blocking HTTP request over a Unix socket: (status, headers, body)."""
    conn = UnixHTTPConnection(socket_path, timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def unix_get(socket_path: Path, path: str, timeout: float = 10.0) -> tuple[int, Any]:
    """GET a JSON document over a Unix socket: (status, parsed body)."""
    status, _, body = unix_request(socket_path, "GET", path, timeout=timeout)
    return status, json.loads(body) if body else None


def wait_ready(socket_path: Path, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    """Until GET /v2/health/ready answers 200; raises (with the runner's
    stderr when ``proc`` is given and has exited) otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"runner exited with {proc.returncode} before it was ready: {err[-3000:]}")
        try:
            if unix_get(socket_path, "/v2/health/ready", timeout=2.0)[0] == 200:
                return
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"runner on {socket_path} not ready after {timeout}s")


def stop_runner(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 15.0) -> tuple[int, str]:
    """Signal the runner, wait for it (SIGKILL after ``timeout``), reap it:
    (exit status, its stderr)."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    return proc.returncode, err or ""


def assert_stopped_cleanly(proc: subprocess.Popen) -> None:
    """stop_runner, which must end in exit status 0; else AssertionError
    with the status and the runner's stderr (an abort at exit says why there)."""
    status, err = stop_runner(proc)
    assert status == 0, f"the runner exited with {status}; its stderr:\n{err[-3000:]}"


def runner_session(socket_path: Path, **kwargs: Any) -> aiohttp.ClientSession:
    """An aiohttp client session whose every request goes to the runner's
    Unix socket (URLs then need only a path: http://runner/v2/...)."""
    return aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket_path)), **kwargs)


processes_with = live_pids  # the name these tests grew up with



def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")
