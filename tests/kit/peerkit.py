"""A fleet of real daemons on loopback ports that list each other as peers."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from kit.daemonkit import DaemonProcess

TOKEN = "fleet-secret-1234"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_config(path: Path, peers: list[str], *, token: str = TOKEN, extra: str = "", peer_extra: str = "",
                wait: str = "5s") -> Path:
    urls = ", ".join(json.dumps(u) for u in peers)
    path.write_text(f"[peers]\nurls = [{urls}]\ntoken = {json.dumps(token)}\ntimeout = \"2s\"\n"
                    f"down_for = \"30s\"\nwait = \"{wait}\"\n{peer_extra}\n[fetch]\nretries = 2\nbackoff_base = \"10ms\"\n"
                    f"backoff_max = \"50ms\"\n{extra}")
    return path


@contextmanager
def fleet(base: Path, count: int, *, scheme: str = "http", peers_of=None,
          **config: str) -> Iterator[list[DaemonProcess]]:
    """``count`` daemons, each listing the others (or ``peers_of(i, urls)``)
    as peers; ``config`` goes to node_config (token, extra, peer_extra, wait)."""
    with ExitStack() as stack:
        yield _start_fleet(stack, base, count, scheme, peers_of, config)


def _start_fleet(stack: ExitStack, base: Path, count: int, scheme: str, peers_of,
                 config: dict[str, str]) -> list[DaemonProcess]:
    # Each node's config names the others' ports, so they are picked before any
    # daemon binds; another test may take one meanwhile: then the fleet starts again.
    for attempt in range(5):
        ports = [free_port() for _ in range(count)]
        urls = [f"{scheme}://127.0.0.1:{p}" for p in ports]
        started = ExitStack()
        try:
            nodes = []
            for i, port in enumerate(ports):
                root = base / f"try{attempt}" / f"n{i}"
                root.mkdir(parents=True)
                peers = peers_of(i, urls) if peers_of else [u for j, u in enumerate(urls) if j != i]
                path = node_config(root.parent / f"n{i}.toml", peers, **config)
                nodes.append(started.enter_context(DaemonProcess(root, listen=f"127.0.0.1:{port}",
                                                                 extra_args=["--config", str(path)])))
        except RuntimeError as e:
            started.close()
            if "Address already in use" in str(e) and attempt < 4:
                continue
            raise
        stack.push(started.pop_all())
        return nodes
    raise AssertionError("unreachable")


def metric(node: DaemonProcess, name: str, labels: str = "") -> float:
    """One sample of the node's /metrics (over TCP, which needs no token):
    ``labels`` as written there, e.g. 'source="peer"'."""
    text = urllib.request.urlopen(f"{node.http_url}/metrics", timeout=10).read().decode()
    sample = f"{name}{{{labels}}} " if labels else f"{name} "
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample))


def make_pki(directory: Path) -> dict[str, Path]:
    """A fleet CA and, signed by it, a certificate for 127.0.0.1 good as both
    server and client (each node's); plus a self-signed stranger's."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    files = {name: directory / name for name in ("ca.pem", "ca.key", "node.pem", "node.key", "node.csr",
                                                  "stranger.pem", "stranger.key", "ext.cnf")}

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=fleet-ca",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", str(files["ca.key"]), "-out", str(files["ca.pem"]))
    files["ext.cnf"].write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
                                "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                                "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(files["node.key"]),
        "-out", str(files["node.csr"]))
    run("x509", "-req", "-in", str(files["node.csr"]), "-CA", str(files["ca.pem"]), "-CAkey", str(files["ca.key"]),
        "-CAcreateserial", "-days", "2", "-out", str(files["node.pem"]), "-extfile", str(files["ext.cnf"]))
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=stranger",
        "-keyout", str(files["stranger.key"]), "-out", str(files["stranger.pem"]))
    return files
