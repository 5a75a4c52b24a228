"""system/syscalls.py: the one table of syscall numbers (checked against
the kernel's headers) and the one rule for what a failed syscall or prctl
raises, by real calls that fail."""

from __future__ import annotations

import ctypes
import errno
import os
import re
from pathlib import Path

import pytest

from cartonstore.system.syscalls import PR_CAPBSET_READ, SYSCALLS, machine, prctl, syscall

pytestmark = pytest.mark.skipif(machine() not in SYSCALLS or os.uname().sysname != "Linux",
                                reason="syscalls are called on Linux on x86_64 and aarch64")
_CAP_VERSION_3 = 0x20080522
_QUERY = 0xFFFFFFFF   # setfsuid(-1): no change, the current id told


@pytest.mark.parametrize(("arch", "header", "pattern"), [
    ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", r"#define __NR_(\w+)\s+(\d+)"),
    ("aarch64", "/usr/include/asm-generic/unistd.h", r"#define __NR(?:3264)?_(\w+)\s+(\d+)"),
])
def test_the_numbers_are_the_kernel_headers(arch: str, header: str, pattern: str) -> None:
    if not Path(header).exists():
        pytest.skip(f"no {header} here (linux-libc-dev)")
    numbers = {name: int(n) for name, n in re.findall(pattern, Path(header).read_text())}
    known = {name: n for name, n in SYSCALLS[arch].items() if name in numbers}
    assert known == {name: numbers[name] for name in known}
    assert len(known) >= len(SYSCALLS[arch]) - 1   # open_tree_attr (Linux 6.15) may be newer than the headers


def test_both_machines_name_the_same_syscalls() -> None:
    assert SYSCALLS["x86_64"].keys() == SYSCALLS["aarch64"].keys()


def test_a_failed_syscall_raises_its_errno_and_name_and_a_result_is_returned_whole() -> None:
    header = (ctypes.c_uint32 * 2)(0, 0)   # version 0: EINVAL, and the kernel writes the version it wants
    with pytest.raises(OSError) as failed:
        syscall("capget", header, (ctypes.c_uint32 * 6)())
    assert failed.value.errno == errno.EINVAL and str(failed.value) == "[Errno 22] capget: Invalid argument"
    assert header[0] == _CAP_VERSION_3
    # setfsuid tells the previous id, never an error
    assert syscall("setfsuid", ctypes.c_uint32(_QUERY)) == os.geteuid()


def test_a_failed_prctl_raises_its_errno_and_option_name() -> None:
    assert prctl(PR_CAPBSET_READ, 0) in (0, 1)
    with pytest.raises(OSError) as failed:
        prctl(PR_CAPBSET_READ, 4096)   # past the kernel's last capability
    assert failed.value.errno == errno.EINVAL
    assert str(failed.value) == "[Errno 22] prctl(PR_CAPBSET_READ): Invalid argument"
