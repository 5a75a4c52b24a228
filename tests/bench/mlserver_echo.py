"""MLServer 1.7 for bench_infer.py: its own virtualenv (installed when
missing, never a project dependency), an echo MLModel, and the server
process on free loopback ports, stopped with its workers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from http11 import CLIENTS, Address

MLSERVER_VENV = Path("/tmp/cartonstore-bench-mlserver")
MLSERVER_REQ = "mlserver==1.7.*"
UVLOOP_REQ = "uvloop<0.22"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    """Every live descendant of pid."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent_of[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent_of.items() if pp == p]
        found += kids
        frontier += kids
    return found


# -- MLServer -------------------------------------------------------------------------

MLSERVER_MODEL = '''
from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


class EchoModel(MLModel):
    """Returns its first input as y_<name>: no decoding, no copy."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = payload.inputs[0]
        return InferenceResponse(model_name=self.name, outputs=[
            ResponseOutput(name="y" + x.name[1:], datatype=x.datatype, shape=x.shape, data=x.data)])
'''


def ensure_mlserver(venv: Path, work: Path) -> tuple[Path | None, str]:
    """The mlserver executable (installing it into venv when missing), or None and why not."""
    exe = venv / "bin" / "mlserver"
    if exe.exists():
        how = f"found in {venv}"
    else:
        print(f"MLServer: not in {venv}; checking that pip can get {MLSERVER_REQ} ...", flush=True)
        check = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(work / "dl"),
                                MLSERVER_REQ], capture_output=True, text=True, timeout=300, check=False)
        if check.returncode != 0:
            return None, f"pip download {MLSERVER_REQ} failed: {check.stderr.strip()[-500:]}"
        print(f"MLServer: installing {MLSERVER_REQ} into {venv} (a few minutes) ...", flush=True)
        for cmd in (["python3", "-m", "venv", str(venv)],
                    [str(venv / "bin" / "pip"), "install", "-q", MLSERVER_REQ, UVLOOP_REQ]):
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=False)
            if r.returncode != 0:
                return None, f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}"
        if not exe.exists():
            return None, f"no {exe} after pip install"
        how = f"installed into {venv}"
    # MLServer 1.7.1's inference workers die at start with uvloop >= 0.22
    # ("There is no current event loop", SeldonIO/MLServer#2286): pin it back.
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import uvloop; print(uvloop.__version__)"],
                           capture_output=True, text=True, check=False)
    found = tuple(int(x) for x in probe.stdout.strip().split(".")[:2] if x.isdigit())
    if probe.returncode == 0 and found >= (0, 22):
        print(f"MLServer: uvloop {probe.stdout.strip()} breaks its workers; installing {UVLOOP_REQ} ...", flush=True)
        r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", UVLOOP_REQ], capture_output=True, text=True,
                           timeout=600, check=False)
        if r.returncode != 0:
            return None, f"pip install {UVLOOP_REQ} failed: {r.stderr.strip()[-500:]}"
        how += f", {UVLOOP_REQ} (was {probe.stdout.strip()})"
    return exe, how


def start_mlserver(exe: Path, work: Path, workers: int | None) -> tuple[subprocess.Popen, Address, int]:
    """The server, its HTTP address and its gRPC port."""
    models = work / "mlserver"
    (models / "echo").mkdir(parents=True)
    (models / "echo" / "echo_model.py").write_text(MLSERVER_MODEL)
    (models / "echo" / "model-settings.json").write_text(json.dumps(
        {"name": "echo", "implementation": "echo_model.EchoModel"}))
    port, grpc_port = free_port(), free_port()
    # 64 MiB gRPC messages: its 4 MiB default refuses a 4 MiB tensor with its header
    settings = {"host": "127.0.0.1", "http_port": port, "grpc_port": grpc_port, "metrics_port": free_port(),
                "debug": False, "grpc_max_message_length": 64 << 20}
    if workers is not None:
        settings["parallel_workers"] = workers
    (models / "settings.json").write_text(json.dumps(settings))
    log = open(work / "mlserver.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([str(exe), "start", str(models)], cwd=models, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its workers share its process group: stopped together
    log.close()
    address = Address(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlserver exited {proc.returncode}: {(work / 'mlserver.log').read_text()[-2000:]}")
        try:
            if asyncio.run(_get_status(address, "/v2/models/echo/ready")) == 200:
                return proc, address, grpc_port
        except OSError:
            pass
        time.sleep(0.5)
    stop_group(proc)
    raise RuntimeError(f"mlserver not ready in 180 s: {(work / 'mlserver.log').read_text()[-2000:]}")


async def _get_status(address: Address, path: str) -> int:
    conn = await CLIENTS["raw"].open(address)
    try:
        return (await conn.request("GET", path))[0]
    finally:
        await conn.close()


def stop_group(proc: subprocess.Popen | None) -> None:
    """SIGTERM the process group we started, SIGKILL what is left after 20 s."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)
