"""A real containerd (Debian's containerd package) for tests: its own root,
state, socket and config under a short directory in /tmp (a Unix socket
path has at most 107 bytes), the CRI plugin and whatever a pull does not
need disabled; ``ctr`` talks to it by that socket. Needs root.

Tests that need one skip, saying why, where the binary or root is missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from kit.prockit import stop_process

BINARY = shutil.which("containerd")
CTR = shutil.which("ctr")
needs_containerd = pytest.mark.skipif(
    BINARY is None or CTR is None or os.geteuid() != 0,
    reason="containerd and ctr (Debian package containerd) and root are needed; .ci/run installs it")

# Nothing of a pull needs these: containers are never run, nor served to a kubelet.
DISABLED = ["io.containerd.grpc.v1.cri", "io.containerd.runtime.v1.linux", "io.containerd.runtime.v2.task",
            "io.containerd.monitor.v1.cgroups", "io.containerd.snapshotter.v1.aufs",
            "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
            "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.overlayfs",
            "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp",
            "io.containerd.internal.v1.tracing"]


class Containerd:
    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(dir="/tmp", prefix="cs-ctrd-"))
        self.address = str(self.workdir / "c.sock")
        self.hosts_dir = self.workdir / "hosts"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Containerd:
        assert BINARY is not None
        disabled = ", ".join(f'"{p}"' for p in DISABLED)
        config = self.workdir / "config.toml"
        config.write_text(f'version = 2\nroot = "{self.workdir / "root"}"\nstate = "{self.workdir / "state"}"\n'
                          f'disabled_plugins = [{disabled}]\n'
                          f'[grpc]\n  address = "{self.address}"\n[ttrpc]\n  address = "{self.address}.ttrpc"\n'
                          f'[debug]\n  address = ""\n[metrics]\n  address = ""\n')
        self.log = open(self.workdir / "containerd.log", "wb")  # noqa: SIM115 - its output, closed by stop()
        self.proc = subprocess.Popen([BINARY, "--config", str(config)], stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"containerd exited: {self.read_log()[-3000:]}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.address)
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"containerd did not listen on {self.address}: {self.read_log()[-3000:]}")

    def mirror(self, upstream: str, mirror: str) -> None:
        """A hosts.toml under hosts_dir: pulls from ``upstream`` go to the
        plain-http ``mirror`` (HOST:PORT) first, as on a node."""
        folder = self.hosts_dir / upstream
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts.toml").write_text(f'server = "http://{upstream}"\n\n[host."http://{mirror}"]\n'
                                           f'  capabilities = ["pull", "resolve"]\n')

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        assert CTR is not None
        return subprocess.run([CTR, "--address", self.address, *args], capture_output=True, text=True,
                              timeout=timeout)

    def read_log(self) -> str:
        try:
            return (self.workdir / "containerd.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.log.close()
            self.proc = None
        # its root holds read-only snapshots and mounts nothing (no snapshotter that mounts is enabled)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Containerd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
