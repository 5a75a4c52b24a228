"""Process start times as tests read them (kit.prockit.started_since_boot):
on the boot clock, to one clock tick, wherever the machine's boot falls
within its second. /proc/stat's btime is whole seconds: an epoch time made
from it is early by that fraction (0.878 s on a machine where a 0.5 s margin
then failed every run), so no test turns start times into epoch times."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from kit.prockit import started_since_boot


def test_a_process_start_time_lies_between_the_boot_clock_readings_around_its_start() -> None:
    tick = 1 / os.sysconf("SC_CLK_TCK")   # /proc counts start times in whole ticks, rounded down
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    after = time.clock_gettime(time.CLOCK_BOOTTIME)
    try:
        assert before - tick <= started_since_boot(proc.pid) <= after, (before, started_since_boot(proc.pid), after)
    finally:
        proc.stdin.close()
        proc.wait()

