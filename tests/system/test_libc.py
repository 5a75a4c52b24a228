"""The C library is reached through dlopen(NULL) (cartonstore/system/libc.py), not
ctypes.util.find_library, which runs ldconfig in a subprocess per call: eight
downloads starting at once forked eight of them (0.8 s before the first
byte was written)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import os, sys
from cartonstore.store.content import filespace
from cartonstore.system.malloc_tuning import keep_big_buffers
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
filespace.reserve(fd, 1 << 20)
os.write(fd, b"x" * 65536)
filespace.start_writeback(fd, 0, 65536)
assert os.fstat(fd).st_blocks * 512 >= 1 << 20, "fallocate did not reserve the space"
print(keep_big_buffers(), "ctypes.util" in sys.modules, "subprocess" in sys.modules)
"""


def test_kernel_hints_and_malloc_tuning_start_no_process(tmp_path: Path) -> None:
    """(Without the user's MALLOC_* settings, which keep_big_buffers leaves alone.)"""
    env_free = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "f")], capture_output=True, text=True,
                         env=env_free, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "False"], out.stdout
