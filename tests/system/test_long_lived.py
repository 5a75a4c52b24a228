"""Server processes freeze what they built before serving (long_lived.py):
a full collection afterwards walks only what came since. In a process of
the test's own, since the collector's state is per process."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_settled_heap_is_frozen_and_garbage_collected_first() -> None:
    script = textwrap.dedent("""
        import gc
        from cartonstore.system.long_lived import settle_heap
        class Cycle:
            pass
        a = Cycle(); a.me = a; del a          # garbage startup left behind
        kept = [[i] for i in range(10_000)]   # tracked by the collector
        settle_heap()
        assert gc.get_freeze_count() >= 10_000, gc.get_freeze_count()
        assert not any(type(o).__name__ == "Cycle" for o in gc.get_objects()), "garbage frozen"
        assert gc.collect() == 0
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
