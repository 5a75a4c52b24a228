"""The plugin's per-target lock: calls on one target wait for each other,
calls on two targets do not, and no lock outlives the calls that needed it
(a node publishes a new target for every pod)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from cartonstore.client import Client
from cartonstore.csi.volumes import Volumes


def test_one_call_at_a_time_per_target_and_no_lock_left(tmp_path: Path) -> None:
    volumes = Volumes(Client(tmp_path / "no-daemon.sock"))
    inside: list[str] = []
    overlap: list[tuple[str, str]] = []
    peak = [0]

    def call(target: str, name: str) -> None:
        with volumes.target_lock(Path(target)):
            overlap.extend((name, other) for other in inside if other.startswith(target))
            inside.append(f"{target}:{name}")
            peak[0] = max(peak[0], len(inside))
            time.sleep(0.05)
            inside.remove(f"{target}:{name}")

    threads = [threading.Thread(target=call, args=(target, str(n))) for target in ("/t/a", "/t/b") for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlap == [] and peak[0] == 2   # never two on one target; the two targets side by side
    assert volumes._target_locks == {}
