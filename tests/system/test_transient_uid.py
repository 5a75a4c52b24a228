"""A transient uid is one nobody else holds: not a process's, whichever of
its uids it is (real, effective, saved, filesystem),
not one a daemon holds in another lock directory it shares (the store's
locks/, seen by daemons in other containers whose /run is their own), not
one systemd handed a DynamicUser service (/run/systemd/dynamic-uid/<uid>).
Each take() runs in a process of its own: a process takes one pair for
its life."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kit import hostview

from cartonstore.system.transient_uid import FIRST, LAST, _named

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a process of another uid is started: needs root")


def free_pair() -> int:
    """A uid u where u and u + 1 are in the range, named nowhere and run by nothing."""
    for uid in range(LAST - 1, FIRST, -2):
        if not _named(uid) and not _named(uid + 1):
            return uid
    pytest.skip("no two free uids in the transient range here")


def take_in_process(lock_dirs: list[Path], first: int, last: int, *, hold: bool = False) -> subprocess.Popen:
    """A process that takes a pair from first-last and prints its uid; with
    ``hold`` it keeps it until its stdin closes."""
    code = ("import sys\nfrom pathlib import Path\nfrom cartonstore.system.transient_uid import take\n"
            f"print(take([Path(d) for d in {[str(d) for d in lock_dirs]!r}], {first}, {last})[0], flush=True)\n"
            + ("sys.stdin.read()\n" if hold else ""))
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def taken(lock_dirs: list[Path], first: int, last: int) -> str:
    proc = take_in_process(lock_dirs, first, last)
    out, err = proc.communicate(timeout=60)
    return out.strip() or err.strip()


def test_a_uid_a_process_runs_as_is_not_taken_whichever_of_its_uids_it_is(tmp_path: Path) -> None:
    uid = free_pair()
    # Its real uid only (as a setuid-root program run by that uid): its /proc directory is its effective
    # uid's, root's, and not dumpable its status is root's file; the status still says every uid it has.
    code = ("import ctypes, os, sys\n"
            f"os.setgroups([]); os.setresgid({uid}, 0, 0); os.setresuid({uid}, 0, 0)\n"
            "ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)\n"   # PR_SET_DUMPABLE 0
            "print('ready', flush=True); sys.stdin.read()\n")
    other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "ready"
        assert os.stat(f"/proc/{other.pid}").st_uid == 0 and os.stat(f"/proc/{other.pid}/status").st_uid == 0
        assert taken([tmp_path], uid, uid + 1) == str(uid + 1)
        assert "no transient uid is free" in taken([tmp_path], uid, uid)
    finally:
        other.stdin.close()
        other.wait(timeout=10)


def test_a_uid_held_in_a_shared_lock_directory_is_not_taken(tmp_path: Path) -> None:
    uid = free_pair()
    host_a, host_b, store_locks = tmp_path / "run-a", tmp_path / "run-b", tmp_path / "store-locks"
    first = take_in_process([host_a, store_locks], uid, uid, hold=True)   # one container's daemon
    try:
        assert first.stdout.readline().strip() == str(uid)
        assert taken([host_b, store_locks], uid, uid + 1) == str(uid + 1)   # another's, its own /run
        assert "no transient uid is free" in taken([host_b, store_locks], uid, uid)
    finally:
        first.stdin.close()
        first.wait(timeout=10)
    assert taken([host_b, store_locks], uid, uid) == str(uid)   # free again once its holder is gone


def test_a_uid_systemd_handed_out_is_not_taken(tmp_path: Path) -> None:
    if (why := hostview.why_not()) is not None:
        pytest.skip(why)
    uid = free_pair()
    script = (f"mkdir -p /run/systemd/dynamic-uid && touch /run/systemd/dynamic-uid/{uid} && "
              f"exec {sys.executable} -c \"from pathlib import Path; from cartonstore.system.transient_uid import "
              f"take; print(take([Path('{tmp_path}')], {uid}, {uid + 1})[0])\"")
    done = subprocess.run(hostview.argv(tmp_path / "view", ["sh", "-c", script]), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.stdout.strip() == str(uid + 1), done.stderr
    assert not Path(f"/run/systemd/dynamic-uid/{uid}").exists()   # the host's /run was not touched
