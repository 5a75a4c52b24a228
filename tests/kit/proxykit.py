"""A real HTTP proxy for tests: Debian's tinyproxy on a loopback port,
logging every request it forwards (GET http://... and CONNECT host:port)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from kit.prockit import stop_process

BINARY = shutil.which("tinyproxy")
needs_tinyproxy = pytest.mark.skipif(BINARY is None, reason="tinyproxy is not installed (apt-get install tinyproxy)")


class TinyProxy:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TinyProxy:
        assert BINARY is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "tinyproxy.log"
        conf = self.workdir / "tinyproxy.conf"
        conf.write_text(f"Port {self.port}\nListen 127.0.0.1\nTimeout 60\nLogLevel Connect\nMaxClients 100\n"
                        f"Allow 127.0.0.1\nDisableViaHeader Yes\nLogFile \"{self.log_path}\"\n")
        self.proc = subprocess.Popen([BINARY, "-d", "-c", str(conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"tinyproxy did not start: {self.log()[-2000:]}") from None
                time.sleep(0.05)

    def requests(self) -> list[str]:
        """What it forwarded: "GET http://host:port/path" or "CONNECT host:port"."""
        out = []
        for line in self.log().splitlines():
            if "]: Request (file descriptor" in line:
                out.append(line.split("): ", 1)[1].rsplit(" HTTP/", 1)[0])
        return out

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except (OSError, AttributeError):
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def __enter__(self) -> TinyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
