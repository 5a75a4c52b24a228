"""A member of the store's group reads it and changes nothing (issue 38,
item 4): the store is root's, its directories 0750 and files 0640 in a
group; uid 65534 in that group runs `ls`, `path`, `inspect` and `verify`
as a real process, while a real daemon on the store writes (leases) and
root adds cartons; then with no process holding the index open, while
root opens, writes and closes it again and again. A user outside the
group, and a member asking for a change, get one line naming the file,
its owner, mode and who may."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FIXTURE_CARTON, FIXTURE_DIGEST, FIXTURES, short_dir, snapshot
from kit.daemonkit import DaemonProcess, call

from cartonstore.server.runner_processes.sandbox import unreachable
from cartonstore.store import Store

NOBODY = 65534
STORE_GID = 45363   # the store's group, by number alone: the kernel needs no name for it
QUICK = FIXTURES / "quickstart.carton"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a root store and a reader of uid 65534")


def share_with_group(root: Path) -> None:
    """As systemd's UMask=0027 with Group= leaves a store: directories 0750,
    files 0640 (blobs 0444), all in the store's group."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chown(dirpath, 0, STORE_GID)
        os.chmod(dirpath, 0o750)
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chown(path, 0, STORE_GID, follow_symlinks=False)
            if not os.path.islink(path):
                os.chmod(path, 0o444 if "/blobs/" in path or "/models/" in path else 0o640)


def as_reader(root: Path, *argv: str, member: bool = True) -> subprocess.CompletedProcess:
    """The CLI as uid 65534, in the store's group or not."""
    return subprocess.run([sys.executable, "-m", "cartonstore.cli", *argv, "--root", str(root)],
                          user=NOBODY, group=NOBODY, extra_groups=[STORE_GID] if member else [],
                          capture_output=True, text=True, timeout=60, cwd="/")


def digests(done: subprocess.CompletedProcess) -> list[str]:
    assert done.returncode == 0, done.stderr
    return [row["manifest_sha256"] for row in json.loads(done.stdout)]


def written_by_reader(root: Path) -> list[str]:
    return [os.path.join(d, n) for d, dirs, files in os.walk(root) for n in dirs + files
            if os.lstat(os.path.join(d, n)).st_uid == NOBODY]


@pytest.fixture(scope="module")
def store_root() -> Iterator[Path]:
    with short_dir() as base:
        os.chmod(base, 0o755)
        for path in (str(base), os.path.realpath(sys.executable)):
            if blocked := unreachable(path, NOBODY, NOBODY):
                pytest.skip(f"uid 65534 cannot reach {path}: {blocked}")
        root = base / "root"
        with Store(root) as s:
            s.add(FIXTURE_CARTON, name="tiny")
            s.materialize("tiny")
        share_with_group(root)
        yield root


def test_a_member_reads_while_a_daemon_writes_and_root_adds(store_root: Path) -> None:
    with DaemonProcess(store_root, listen=None, extra_args=["--no-restore"]) as daemon:
        assert (store_root / "index.db-wal").exists() and (store_root / "index.db-shm").stat().st_mode & 0o777 == 0o640
        stop = threading.Event()
        leases: list[int] = []

        def lease_in_a_loop() -> None:   # the daemon writes the index all along
            while not stop.is_set():
                leases.append(call(daemon, "POST", "/v1/leases", json={"model": "tiny", "ttl": 60})[0])

        writer = threading.Thread(target=lease_in_a_loop)
        writer.start()
        try:
            assert digests(as_reader(store_root, "ls", "--json")) == [FIXTURE_DIGEST]
            done = as_reader(store_root, "path", "tiny")
            assert done.returncode == 0 and done.stdout.splitlines()[-1] == str(store_root / "models" / FIXTURE_DIGEST)
            done = as_reader(store_root, "inspect", "tiny", "--json")
            assert done.returncode == 0 and json.loads(done.stdout)["names"] == ["tiny"], done.stderr
            done = as_reader(store_root, "verify", "--json")
            assert done.returncode == 0 and json.loads(done.stdout)["ok"] is True, done.stderr
            with Store(store_root) as s:   # a commit the reader sees in the WAL, as it lands
                quick = s.add(QUICK, name="quick").digest
            assert digests(as_reader(store_root, "ls", "--json")) == [FIXTURE_DIGEST, quick]
        finally:
            stop.set()
            writer.join()
        assert leases and set(leases) == {200}
    assert written_by_reader(store_root) == []


def test_a_member_reads_a_store_no_process_has_open(store_root: Path) -> None:
    """No -wal file, and the member may not make one: the index is read as
    its main file holds it, also while root opens, writes and closes it
    (each reader sees one of the states a writer left, whole)."""
    with Store(store_root) as s:
        quick = s.add(QUICK, name="quick").digest
    assert not (store_root / "index.db-wal").exists()
    states = ({FIXTURE_DIGEST, quick}, {FIXTURE_DIGEST})   # what a writer leaves between its transactions
    stop = threading.Event()
    cycles = [0]

    def open_write_close() -> None:
        while not stop.is_set():
            with Store(store_root) as s:
                s.remove("quick")
            with Store(store_root) as s:
                s.add(QUICK, name="quick")
            cycles[0] += 1

    writer = threading.Thread(target=open_write_close)
    writer.start()
    try:
        seen = [set(digests(as_reader(store_root, "ls", "--json"))) for _ in range(12)]
    finally:
        stop.set()
        writer.join()
    assert cycles[0] > 0 and all(state in states for state in seen), seen
    assert digests(as_reader(store_root, "ls", "--json")) == [FIXTURE_DIGEST, quick]
    assert written_by_reader(store_root) == []


def test_a_user_outside_the_group_is_told_which_group_to_join(store_root: Path) -> None:
    for argv in (["ls"], ["path", "tiny"], ["inspect", "tiny"], ["verify"]):
        done = as_reader(store_root, *argv, member=False)
        assert done.returncode == 9, done.stderr
        assert done.stderr == (f"cartonstore {argv[0]}: error: this user may not read the store: {store_root} is "
                               f"owned by root:{STORE_GID}, mode 0750: join group {STORE_GID} (then log in again) "
                               "or run as root\n")


@pytest.mark.parametrize("argv", [["rm", "tiny"], ["verify", "--repair"], ["add", str(QUICK), "--name", "q2"],
                                  ["path", "quick2"]])
def test_a_member_asking_for_a_change_is_told_who_may(store_root: Path, argv: list[str]) -> None:
    with Store(store_root) as s:   # a carton known, not yet built: `path` would build it
        s.add(QUICK, name="quick2")
    share_with_group(store_root)
    before = snapshot(store_root)
    done = as_reader(store_root, *argv)
    assert done.returncode == 9, done.stderr
    assert done.stderr.endswith(f"would change the store, which this user may only read: {store_root}/index.db "
                                f"is owned by root:{STORE_GID}, mode 0640: run as root\n") or \
        done.stderr.endswith(f"this user may not change the store: {store_root}/index.db is owned by "
                             f"root:{STORE_GID}, mode 0640: run as root\n"), done.stderr
    assert done.stderr.count("\n") == 1 and snapshot(store_root) == before
