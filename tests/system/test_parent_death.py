"""parent_death.die_with: the one place both a runner's preexec_fn and a
process arming itself ask the kernel to kill them with their parent.
Each case runs in a child of its own, so the test process is never armed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from kit.prockit import wait_gone

ARMED = textwrap.dedent("""
    import ctypes, os, signal, sys
    from cartonstore.system.parent_death import die_with
    print(die_with({parent}, {sig}), flush=True)
    got = ctypes.c_int(-1)
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(got), 0, 0, 0)   # PR_GET_PDEATHSIG
    print(got.value, flush=True)
""")


def run_child(parent: str, sig: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ARMED.format(parent=parent, sig=sig)],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_signal_is_armed_with_the_real_parent(sig: int) -> None:
    done = run_child("os.getppid()", sig)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", str(int(sig))]


def test_a_parent_already_gone_ends_the_process_at_once() -> None:
    """Its parent is not the one named (as when the daemon died before the
    child ran): it exits 1 before doing anything else."""
    done = run_child("os.getppid() + 1", signal.SIGKILL)
    assert done.returncode == 1 and done.stdout == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_armed_between_fork_and_exec_dies_with_its_sigkilled_parent() -> None:
    """As the daemon starts a runner: the middle process starts a sleeper
    with die_with as its preexec_fn, then is SIGKILLed; the sleeper goes too."""
    middle = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import functools, os, subprocess, sys, time
        from cartonstore.system.parent_death import die_with
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 preexec_fn=functools.partial(die_with, os.getpid()))
        print(child.pid, flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        sleeper = int(middle.stdout.readline())
        os.kill(middle.pid, signal.SIGKILL)
        middle.wait(10)
        assert wait_gone(sleeper)
    finally:
        if middle.poll() is None:
            middle.kill()
            middle.wait(10)
        middle.stdout.close()
