"""A runner's life (the runner SDK, as a real process on a real Unix
socket): SIGTERM finishes what is in flight and exits 0, whichever thread
the kernel hands it to; it dies with its parent; load failures exit 3
naming why; bad arguments and sockets are refused; a stale socket is
replaced. Every test checks that no runner process is left."""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kit.daemonkit import wait_for
from kit.doublerkit import assert_none_left, doubler_root, infer, start
from kit.runnerkit import (
    PY,
    assert_stopped_cleanly,
    runner_argv,
    start_runner,
    stop_runner,
    wait_gone,
    wait_ready,
)

from cartonstore.runner.protocol import EXIT_LOAD_FAILED

doubler_dir = pytest.fixture(scope="module", name="doubler_dir")(doubler_root)


@pytest.fixture(autouse=True)
def no_runner_left(doubler_dir: Path) -> Iterator[None]:
    yield
    assert_none_left(str(doubler_dir))


def test_sigterm_finishes_the_infer_in_flight_then_exits_0(doubler_dir: Path) -> None:
    proc, sock = start(doubler_dir, "term", name="dbl")
    wait_ready(sock, proc=proc)
    result: dict[str, Any] = {}
    computing = doubler_dir / "term.computing"

    def slow() -> None:
        result["out"] = infer(sock, {"x": np.array([4], np.float32)},
                              parameters={"sleep": 1.0, "started": str(computing)})[1]

    thread = threading.Thread(target=slow)
    thread.start()
    assert wait_for(computing.exists)
    proc.send_signal(signal.SIGTERM)
    thread.join(10)
    rc, err = stop_runner(proc, sig=0)
    assert rc == 0, err
    assert result["out"]["y"].tolist() == [8]
    assert not sock.exists()


def _tgkill(pid: int, tid: int, sig: int) -> None:
    """``sig`` to one thread of another process (the syscall; Python has
    pthread_kill only for its own threads)."""
    import ctypes

    number = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
    if number is None:
        pytest.skip(f"tgkill's syscall number on {platform.machine()} is not known here")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {tid}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_that_lands_on_a_connections_thread_stops_the_runner(doubler_dir: Path, sig: int) -> None:
    """The kernel may hand a process's SIGTERM to any thread (the main one
    busy with another signal). Sent here to the thread serving an idle
    connection, with the main thread asleep in poll(): the runner still
    stops at once and exits 0 (it slept until the next connection came)."""
    proc, sock = start(doubler_dir, "tg", name="dbl")
    wait_ready(sock, proc=proc)
    idle = socket.socket(socket.AF_UNIX)
    try:
        idle.connect(str(sock))
        idle.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: r\r\n\r\n")
        assert idle.recv(4096).startswith(b"HTTP/1.1 200")   # its thread now waits for the next request
        others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert others, "the runner has no thread but its main one"
        # One non-main thread (most likely the idle connection's), once: a second signal could land after
        # the interpreter, exiting, put back the default action, and end the runner by that signal instead.
        _tgkill(proc.pid, max(others), sig)
        proc.wait(timeout=10)
        rc, err = stop_runner(proc, sig=0)
        assert rc == 0, err
    finally:
        idle.close()
        stop_runner(proc)


def test_runner_dies_with_its_parent(doubler_dir: Path) -> None:
    argv = runner_argv(str(doubler_dir / "doubler.py"), doubler_dir / "carton", doubler_dir / "orphan.sock")
    parent = subprocess.Popen(
        [PY, "-c", "import subprocess, sys, time; p = subprocess.Popen(sys.argv[1:]); "
                   "print(p.pid, flush=True); time.sleep(60)", *argv],
        stdout=subprocess.PIPE, text=True)
    try:
        runner_pid = int(parent.stdout.readline())
        wait_ready(doubler_dir / "orphan.sock")
        parent.kill()
        parent.wait(10)
        assert wait_gone(runner_pid, 10), "the runner outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait(10)
        parent.stdout.close()


@pytest.mark.parametrize("opts, last_line", [
    ({"refuse": True}, "cartonstore runner: cannot load the model: refused: opts say so"),
    ({"explode": True}, "cartonstore runner: cannot load the model: ZeroDivisionError: division by zero"),
])
def test_load_failure_exits_3_with_the_reason_last(doubler_dir: Path, opts: dict, last_line: str) -> None:
    proc, sock = start(doubler_dir, "refuse", opts)
    rc, err = stop_runner(proc, sig=0, timeout=20)
    assert rc == EXIT_LOAD_FAILED
    assert err.strip().splitlines()[-1] == last_line
    assert not sock.exists()


def test_bad_arguments_and_sockets(doubler_dir: Path) -> None:
    script = str(doubler_dir / "doubler.py")
    missing = subprocess.run([PY, script, "--model-dir", str(doubler_dir)], capture_output=True, text=True, timeout=20)
    assert missing.returncode == 2 and "--socket" in missing.stderr
    bad_opts = subprocess.run([*runner_argv(script, doubler_dir / "carton", doubler_dir / "x.sock")[:-4],
                               "--opts", "[1]"], capture_output=True, text=True, timeout=20)
    assert bad_opts.returncode == 2 and "JSON object" in bad_opts.stderr

    no_dir = start_runner(script, doubler_dir / "absent", doubler_dir / "x.sock")
    rc, err = stop_runner(no_dir, sig=0, timeout=20)
    assert rc == EXIT_LOAD_FAILED and "does not exist" in err

    not_a_socket = doubler_dir / "file.sock"
    not_a_socket.write_text("mine")
    proc = start_runner(script, doubler_dir / "carton", not_a_socket)
    rc, err = stop_runner(proc, sig=0, timeout=20)
    assert rc == EXIT_LOAD_FAILED and "is not a socket" in err
    assert not_a_socket.read_text() == "mine"

    too_long = doubler_dir / ("s" * 120 + ".sock")
    proc = start_runner(script, doubler_dir / "carton", too_long)
    rc, err = stop_runner(proc, sig=0, timeout=20)
    assert rc == EXIT_LOAD_FAILED and "limit of Unix sockets" in err


def test_stale_socket_is_replaced(doubler_dir: Path) -> None:
    stale = doubler_dir / "stale.sock"
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(stale))
    leftover.close()
    proc = start_runner(str(doubler_dir / "doubler.py"), doubler_dir / "carton", stale, name="dbl")
    try:
        wait_ready(stale, proc=proc)
    finally:
        assert_stopped_cleanly(proc)
