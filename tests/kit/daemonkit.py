"""Real daemon processes for tests, started the way systemd does it.

The test plays systemd's part: it binds a datagram socket, passes it as
NOTIFY_SOCKET and waits for READY=1, whose STATUS line carries the bound
addresses (so port 0 works). The notify socket lives in a directory of its
own under /tmp, not beside the store root: a Unix socket path has at most
107 bytes, and tmp_path can be longer than that (pytest-xdist, --basetemp).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp


class DaemonProcess:
    def __init__(self, root: Path, *, listen: str | None = "127.0.0.1:0", socket_path: Path | None = None,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                 pass_fds: tuple[int, ...] = (), log_file: Path | None = None) -> None:
        """log_file: the daemon's stderr goes there, not to a pipe that only a
        reader keeps from filling (a daemon that logs a lot would block on it)."""
        self.root = root
        self.socket_path = socket_path or root / "cartonstore.sock"
        self.listen = listen
        self.extra_args = extra_args or []
        self.env = env or {}
        self.pass_fds = pass_fds
        self.log_file = log_file
        self.proc: subprocess.Popen | None = None
        self.status = ""

    def argv(self) -> list[str]:
        args = [sys.executable, "-m", "cartonstore.cli", "serve", "--root", str(self.root),
                "--socket", str(self.socket_path)]
        if self.listen:
            args += ["--listen", self.listen]
        return args + self.extra_args

    def start(self, timeout: float = 30.0) -> DaemonProcess:
        self.root.mkdir(parents=True, exist_ok=True)
        notify_dir = tempfile.mkdtemp(dir="/tmp", prefix="cs-notify-")
        notify_path = os.path.join(notify_dir, "notify.sock")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            notify.bind(notify_path)
            notify.settimeout(0.2)
            env = {**os.environ, "NOTIFY_SOCKET": notify_path, **self.env}
            stderr = open(self.log_file, "a") if self.log_file is not None else subprocess.PIPE  # noqa: SIM115 - the daemon's stderr, closed by stop()
            try:
                self.proc = subprocess.Popen(self.argv(), env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                             pass_fds=self.pass_fds)
            finally:
                if self.log_file is not None:
                    stderr.close()
            deadline = time.monotonic() + timeout
            while True:
                try:
                    msg = notify.recv(4096).decode()
                except TimeoutError:
                    if self.proc.poll() is not None:  # it exited: no need to wait out the timeout
                        raise RuntimeError(f"daemon exited before ready: {self.stop_and_read()}") from None
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"daemon not ready in {timeout}s: {self.stop_and_read()}") from None
                    continue
                if "READY=1" in msg:
                    self.status = msg
                    return self
        finally:
            notify.close()
            shutil.rmtree(notify_dir, ignore_errors=True)

    @property
    def http_url(self) -> str:
        return next(w for w in self.status.split() if w.startswith(("http://", "https://")))

    @property
    def host_port(self) -> str:
        return self.http_url.split("://", 1)[1]

    @property
    def grpc_unix(self) -> str:
        """The gRPC Unix socket as tritonclient.grpc takes it: unix://PATH."""
        return "unix://" + next(w for w in self.status.split() if w.startswith("grpc+unix:"))[len("grpc+unix:"):]

    @property
    def grpc_host_port(self) -> str:
        return next(w for w in self.status.split() if w.startswith(("grpc://", "grpcs://"))).split("://", 1)[1]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def stop_and_read(self) -> str:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        _out, err = self.proc.communicate(timeout=10) if self.proc else ("", "")
        if self.log_file is not None:
            err = self.log_file.read_text(errors="replace")
        return f"exit {self.proc.returncode if self.proc else None}; stderr: {err[-3000:]}"

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            self.stop()


def unix_session(path: Path) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(path)),
                                 base_url="http://cartonstore")


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    """True as soon as ``predicate()`` is, False after ``timeout`` seconds:
    how tests wait for a condition (a fixed sleep is too short on a busy
    machine and too long on an idle one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


async def wait_for_async(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """wait_for inside an event loop: ``predicate()`` may return a bool or
    an awaitable of one; the loop runs on between the checks."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = predicate()
        if inspect.isawaitable(answer):
            answer = await answer
        if answer:
            return True
        await asyncio.sleep(interval)
    return False


__all__ = ["DaemonProcess", "signal", "unix_session", "wait_for", "wait_for_async"]


async def call_socket(sock: Path, method: str, path: str, **kw) -> tuple[int, object]:
    async with unix_session(sock) as s, s.request(method, path, **kw) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return r.status, text


def call(d: DaemonProcess, method: str, path: str, **kw) -> tuple[int, object]:
    return asyncio.run(call_socket(d.socket_path, method, path, **kw))
