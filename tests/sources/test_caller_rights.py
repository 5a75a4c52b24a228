"""Sources opened with a caller's rights (system/callers.py): through them a
caller reads only what it could read itself, and errors name the path it
gave and its uid, nothing behind it; the rest of the process keeps its own
rights."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cartonstore.errors import InvalidCarton, PermissionDenied
from cartonstore.server.runner_processes.sandbox import unreachable
from cartonstore.sources import open_local
from cartonstore.system.callers import MAX_PEER_GROUPS, CallerRights, Credentials, peer_credentials

NOBODY = Credentials(65534, 65534, ())
DATA_GID = 45362

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="taking a caller's identity needs root")


def carton_dir(root: Path, mode: int = 0o755) -> Path:
    (root / "model").mkdir(parents=True)
    (root / "carton.toml").write_text('spec_version = 1\nmodel_name = "m"\n\n[runner]\nrunner_name = "none"\n'
                                      'required_framework_version = "=1.0.0"\nrunner_compat_version = 1\n')
    (root / "model" / "w.bin").write_bytes(b"weights")
    os.chmod(root, mode)
    return root


@pytest.fixture
def base(short_tmp: Path) -> Path:
    os.chmod(short_tmp, 0o755)
    blocked = unreachable(str(short_tmp), NOBODY.uid, NOBODY.gid)
    if blocked:
        pytest.skip(f"uid 65534 cannot reach the test's directory: {blocked}")
    return short_tmp


def test_a_directory_the_caller_cannot_read_is_refused_naming_only_the_path(base: Path) -> None:
    secret = base / "secret"
    secret.mkdir(mode=0o700)
    carton_dir(secret / "model1")
    (secret / "id_rsa").write_text("-----BEGIN")
    with CallerRights(NOBODY) as rights:
        for path in (secret / "model1", secret):
            with pytest.raises(PermissionDenied) as refused:
                open_local(path, rights=rights)
            assert str(refused.value) == f"permission denied: {path} (as uid 65534)"
    assert sorted(open_local(secret / "model1").files) == ["carton.toml", "model/w.bin"]   # the process's own rights


def test_a_folder_inside_the_caller_cannot_list_fails_the_view_by_name(base: Path) -> None:
    source = carton_dir(base / "c")
    (source / "model" / "private").mkdir(mode=0o700)
    (source / "model" / "private" / "key").write_text("k")
    with CallerRights(NOBODY) as rights, pytest.raises(PermissionDenied, match="model/private \\(as uid 65534\\)"):
        open_local(source, rights=rights, confined=True)


def test_a_file_the_caller_cannot_read_is_refused_when_opened(base: Path) -> None:
    source = carton_dir(base / "c")
    os.chmod(source / "model" / "w.bin", 0o600)
    with CallerRights(NOBODY) as rights:
        view = open_local(source, rights=rights, confined=True)
        assert sorted(view.files) == ["carton.toml", "model/w.bin"]   # names from a listing the caller may read
        with pytest.raises(PermissionDenied, match=f"permission denied: {source}/model/w.bin \\(as uid 65534\\)"):
            view.open("model/w.bin")
        with open(source / "model" / "w.bin", "rb") as f:   # other threads keep the process's rights
            assert f.read() == b"weights"


def test_a_carton_file_is_read_as_the_caller(base: Path) -> None:
    from cartonstore.carton.pack import pack_directory

    packed = base / "m.carton"
    pack_directory(carton_dir(base / "c"), packed)
    os.chmod(packed, 0o600)
    with CallerRights(NOBODY) as rights:
        with pytest.raises(PermissionDenied, match=f"permission denied: {packed} \\(as uid 65534\\)"):
            open_local(packed, rights=rights)
        os.chmod(packed, 0o644)
        view = open_local(packed, rights=rights)
        swapped = base / "other"
        swapped.write_bytes(b"not the caller's file")
        os.replace(swapped, packed)
        with view.raw_file() as raw:   # what ingest copies stored spans from: the file opened, not the path
            assert raw.read(2) == b"PK"
        view.close()


def test_supplementary_groups_count(base: Path) -> None:
    source = carton_dir(base / "g", mode=0o750)
    for path in (source, source / "model"):
        os.chown(path, 0, DATA_GID)
    os.chmod(source / "model", 0o750)
    with CallerRights(Credentials(65534, 65534, (DATA_GID,))) as rights:
        assert sorted(open_local(source, rights=rights).files) == ["carton.toml", "model/w.bin"]
    with CallerRights(NOBODY) as rights, pytest.raises(PermissionDenied):
        open_local(source, rights=rights)


def test_a_fifo_named_as_a_carton_fails_at_once(base: Path) -> None:
    fifo = base / "pipe.carton"
    os.mkfifo(fifo, 0o644)
    outcome: list[BaseException] = []

    def try_it() -> None:
        with CallerRights(NOBODY) as rights:
            try:
                open_local(fifo, rights=rights)
            except BaseException as e:  # noqa: BLE001 - looked at below
                outcome.append(e)

    t = threading.Thread(target=try_it, daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():   # unblock the open that hangs, so the thread ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("opening a fifo as a carton hung")
    assert isinstance(outcome[0], InvalidCarton) and "not a regular file" in str(outcome[0])


_NOT_ROOT = """
from cartonstore.system.callers import CallerRights, Credentials
with CallerRights(Credentials(65534, 65534, ())) as own:   # its own uid: no identity to take
    print(own.run(lambda: open("/etc/hostname").read() != ""))
try:
    CallerRights(Credentials(0, 0, ()))
except Exception as e:
    print(type(e).__name__, e)
"""


def test_a_process_that_cannot_take_another_identity_refuses_by_name(base: Path) -> None:
    blocked = unreachable(os.path.realpath(sys.executable), NOBODY.uid, NOBODY.gid)
    if blocked:
        pytest.skip(f"uid 65534 cannot reach this Python: {blocked}")
    out = subprocess.run([sys.executable, "-c", _NOT_ROOT], user=NOBODY.uid, group=NOBODY.gid, extra_groups=[],
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    own, refused = out.stdout.splitlines()
    assert own == "True"
    assert refused.startswith("PermissionDenied the daemon runs as uid 65534 and cannot read files as uid 0")


_CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.recv(1)   # until the test has read its credentials
"""


def peer_in_groups(base: Path, groups: list[int]) -> Credentials:
    """The credentials read from a Unix socket whose peer is uid 65534 in ``groups``."""
    blocked = unreachable(os.path.realpath(sys.executable), NOBODY.uid, NOBODY.gid)
    if blocked:
        pytest.skip(f"uid 65534 cannot reach this Python: {blocked}")
    path = base / "caller.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        os.chmod(path, 0o777)
        listener.listen(1)
        listener.settimeout(60)
        child = subprocess.Popen([sys.executable, "-c", _CONNECT, str(path)], user=NOBODY.uid, group=NOBODY.gid,
                                 extra_groups=groups, cwd="/")
        try:
            conn, _ = listener.accept()
            with conn:
                return peer_credentials(conn)
        finally:
            child.wait(60)


def test_a_caller_in_a_hundred_groups_is_read_with_all_of_them(base: Path) -> None:
    groups = [*range(40000, 40099), DATA_GID]   # DATA_GID the last (the kernel sorts them), past the 64th
    creds = peer_in_groups(base, groups)
    assert (creds.uid, creds.gid, sorted(creds.groups or ())) == (NOBODY.uid, NOBODY.gid, sorted(groups))
    source = carton_dir(base / "g", mode=0o750)
    for path in (source, source / "model"):
        os.chown(path, 0, DATA_GID)
    os.chmod(source / "model", 0o750)
    with CallerRights(creds) as rights:
        assert sorted(open_local(source, rights=rights).files) == ["carton.toml", "model/w.bin"]


def test_a_caller_in_more_groups_than_can_be_read_is_refused_by_name(base: Path) -> None:
    """Read as it without some of its groups, it could be let in where one of them is shut out."""
    creds = peer_in_groups(base, list(range(40000, 40000 + MAX_PEER_GROUPS + 1)))
    assert (creds.uid, creds.groups) == (NOBODY.uid, None)
    with pytest.raises(PermissionDenied, match=f"cannot read files as uid 65534: the kernel did not tell all of "
                                               f"its supplementary groups \\(a caller in more than {MAX_PEER_GROUPS} "
                                               "groups"):
        CallerRights(creds)
