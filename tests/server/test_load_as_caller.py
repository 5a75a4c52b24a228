"""A root daemon reads a path a caller names with the caller's rights: as
uid 65534 in the socket's group, a caller cannot load, lease or list what it
could not read itself (HTTP and gRPC), yet loads what it can, its
supplementary groups counted; over TCP, where no uid is known, a path is
refused unless server.allow_tcp_local_sources."""

from __future__ import annotations

import grp
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as tg
from conftest import short_dir
from kit.daemonkit import DaemonProcess, call

from cartonstore.carton.pack import pack_directory
from cartonstore.server.runner_processes.sandbox import unreachable
from cartonstore.store import Store
from cartonstore.store.metadata.names import is_valid_name

NOBODY = 65534
DATA_GID = 45362   # a group by number alone: the kernel needs no name for it

SOCKET_GID = -1    # the group "users", once the daemon starts

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a root daemon and a client as uid 65534")

_CLIENT = r"""
import http.client, json, socket, sys

class Unix(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("cartonstore", timeout=60)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.unix_path)

def grpc_load(url, name, source):
    import grpc
    from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc as pb_grpc
    request = pb.RepositoryModelLoadRequest(
        model_name=name, parameters={"source": pb.ModelRepositoryParameter(string_param=source)})
    with grpc.insecure_channel(url) as channel:
        try:
            pb_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(request, timeout=60)
            return {"code": "OK"}
        except grpc.RpcError as e:
            return {"code": e.code().name, "error": e.details()}

socket_path, grpc_url, requests = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for method, path, body in requests:
    if method == "GRPC-LOAD":
        print(json.dumps(grpc_load(grpc_url, path, body)))
        continue
    c = Unix(socket_path)
    c.request(method, path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    answer = c.getresponse()
    text = answer.read().decode()
    print(json.dumps({"status": answer.status, "body": json.loads(text) if text else None}))
"""


def carton_dir(root: Path, mode: int = 0o755) -> Path:
    """A carton that loads as files only (no runner is configured for it)."""
    (root / "model").mkdir(parents=True)
    (root / "carton.toml").write_text(f'spec_version = 1\nmodel_name = "{root.name}"\n\n[runner]\n'
                                      'runner_name = "none"\nrequired_framework_version = "=1.0.0"\n'
                                      'runner_compat_version = 1\n')
    (root / "model" / "weights.bin").write_bytes(root.name.encode() * 100)
    os.chmod(root, mode)
    return root


class Sources:
    """The paths the tests name, made by root: some the caller may read, some not."""

    def __init__(self, base: Path) -> None:
        self.secret = base / "secret"          # 0700 root: neither it nor anything in it is the caller's
        self.secret.mkdir(mode=0o700)
        self.hidden = carton_dir(self.secret / "model1")
        (self.secret / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----")
        shared = base / "open"
        shared.mkdir(mode=0o755)
        self.mine = carton_dir(shared / "mine")
        self.readable = pack_directory(carton_dir(base / "packed-a"), shared / "readable.carton").path
        self.root_only = pack_directory(carton_dir(base / "packed-b"), shared / "root-only.carton").path
        os.chmod(self.readable, 0o644)
        os.chmod(self.root_only, 0o600)
        self.grouped = carton_dir(base / "grouped", mode=0o750)   # the caller's through a supplementary group
        os.chmod(self.grouped / "model", 0o750)
        for path in (self.grouped, self.grouped / "model"):
            os.chown(path, 0, DATA_GID)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[DaemonProcess, Sources]]:
    global SOCKET_GID
    try:   # the socket's group must have a name (server.socket_group is checked at start)
        SOCKET_GID = grp.getgrnam("users").gr_gid
    except KeyError:
        pytest.skip("no group 'users' to own the daemon's socket")
    with short_dir() as base:
        os.chmod(base, 0o755)
        for path in (str(base), os.path.realpath(sys.executable), os.path.dirname(tg.__file__)):
            if blocked := unreachable(path, NOBODY, NOBODY):
                pytest.skip(f"uid 65534 cannot reach {path}: {blocked}")
        config = base / "cartonstore.toml"
        config.write_text('[server]\nsocket_group = "users"\n')
        d = DaemonProcess(base / "root", extra_args=["--config", str(config)]).start()
        try:
            os.chmod(d.root, 0o755)   # the caller reaches the sockets by their group alone
            yield d, Sources(base)
        finally:
            d.stop()


def as_nobody(d: DaemonProcess, *requests: tuple[str, str, Any]) -> list[dict[str, Any]]:
    """Each request's answer, sent by a process of uid 65534 in the socket's
    group (and DATA_GID), the way any local user in that group would."""
    out = subprocess.run([sys.executable, "-c", _CLIENT, str(d.socket_path), d.grpc_unix, json.dumps(requests)],
                         user=NOBODY, group=NOBODY, extra_groups=[SOCKET_GID, DATA_GID], capture_output=True,
                         text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def load(name: str, source: Path) -> tuple[str, str, Any]:
    return "POST", f"/v2/repository/models/{name}/load", {"parameters": {"source": str(source)}}


def lease(model: Path | str) -> tuple[str, str, Any]:
    return "POST", "/v1/leases", {"model": str(model), "ttl": 60}


def cartons(d: DaemonProcess) -> list[str]:
    with Store(d.root) as store:
        return sorted(info.row.digest for info in store.list())


def test_a_caller_cannot_load_lease_or_list_what_it_cannot_read(served: tuple[DaemonProcess, Sources]) -> None:
    d, src = served
    before = cartons(d)
    answers = as_nobody(d, load("m1", src.hidden), load("m2", src.secret), load("m3", src.root_only),
                        lease(src.hidden), lease(src.secret), lease(src.root_only),
                        ("GRPC-LOAD", "m4", str(src.hidden)), ("GRPC-LOAD", "m5", str(src.secret)))
    named = [src.hidden, src.secret, src.root_only] * 2
    for answer, path in zip(answers[:6], named, strict=True):
        assert answer["status"] == 403, answer
        assert f"permission denied: {path} (as uid {NOBODY})" in answer["body"]["error"]
    for answer, path in zip(answers[6:], [src.hidden, src.secret], strict=True):
        assert answer["code"] == "PERMISSION_DENIED" and f"permission denied: {path} (as uid {NOBODY})" in \
            answer["error"], answer
    told = json.dumps(answers)
    for entry in ("id_rsa", "OPENSSH", "carton.toml", "weights", "model/"):   # nothing behind the paths
        assert entry not in told
    assert cartons(d) == before


def test_the_same_caller_loads_and_leases_what_it_can_read(served: tuple[DaemonProcess, Sources]) -> None:
    d, src = served
    answers = as_nobody(d, load("mine", src.mine), load("packed", src.readable), load("grouped", src.grouped),
                        lease(src.mine), ("GRPC-LOAD", "mine-grpc", str(src.mine)))
    assert [a.get("status", a.get("code")) for a in answers] == [200, 200, 200, 200, "OK"], answers
    leased = answers[3]["body"]
    assert (Path(leased["path"]) / "model" / "weights.bin").read_bytes() == b"mine" * 100
    with Store(d.root) as store:   # nothing the daemon would read again later, with its own rights
        for info in store.list():
            assert store.index.local_sources_for(info.row.digest) == []
            assert all(store.index.local_sources_for(e.digest) == [] for e in store.index.entries(info.row.digest))


def test_a_lease_of_a_name_never_reads_the_daemons_working_directory(served: tuple[DaemonProcess, Sources]) -> None:
    d, _ = served
    here = next(n for n in sorted(os.listdir(os.getcwd())) if is_valid_name(n) and os.path.isdir(n))
    status, body = call(d, "POST", "/v1/leases", json={"model": here, "ttl": 60})
    assert status == 404 and "no carton matches" in body["error"], body


def tcp(d: DaemonProcess, path: str, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(d.http_url + path, data=json.dumps(doc).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_over_tcp_a_local_source_is_refused_unless_allowed(served: tuple[DaemonProcess, Sources],
                                                           short_tmp: Path) -> None:
    d, src = served
    for path, doc in (load("tcp", src.mine)[1:], lease(src.mine)[1:]):
        status, body = tcp(d, path, doc)
        assert status == 403 and "allow_tcp_local_sources" in body["error"], body
    config = short_tmp / "cartonstore.toml"
    config.write_text("[server]\nallow_tcp_local_sources = true\n")
    with DaemonProcess(short_tmp / "root", extra_args=["--config", str(config)]) as allowing:
        status, body = tcp(allowing, *load("tcp", src.mine)[1:])
        assert status == 200, body
