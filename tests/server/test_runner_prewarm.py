"""Runners started before their model (issue 29, parts 1 and 2), with real
daemons, runners, origins and sandboxes: a pre-warmed spare takes a load
(its process existed before the load was asked for); a load by URL starts
its runner while the carton's blobs are still coming; whatever was started
and not used, a spare that dies, a load that fails, a daemon that stops,
leaves no process and no slot behind.

The model says when its own process started (from /proc/self/stat), so
each test sees from outside which process served it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import short_dir
from kit.daemonkit import DaemonProcess, call, wait_for
from kit.inferkit import echo_toml, onnx_carton, spares_run
from kit.origin import Fault, Origin
from kit.prockit import live_pids, started_since_boot
from kit.sandboxkit import runner_user, why_not
from kit.together import all_at_once

from cartonstore.carton.pack import pack_directory

pytestmark = pytest.mark.slow   # each test its daemons, spares and sandboxes, started and stopped

STARTED_MAIN = '''
import os
import time

import numpy as np


def started():
    """When this process started, in seconds since the epoch."""
    ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)   # /proc/uptime is not the sandbox's to read
    return time.time() - since_boot + ticks / os.sysconf("SC_CLK_TCK")


class Model:
    def infer_with_tensors(self, tensors):
        return {"y_float64": np.full((1, 1), started())}


def get_model():
    {startup}
    return Model()
'''


def started_carton(dest: Path, *, startup: str = "pass", weights: int = 0) -> Path:
    (dest / "model").mkdir(parents=True)
    (dest / "carton.toml").write_text(echo_toml("started", dtypes=["float64"]))
    (dest / "model" / "main.py").write_text(STARTED_MAIN.replace("{startup}", startup))
    if weights:
        (dest / "model" / "weights.bin").write_bytes(os.urandom(weights))
    return dest


def started_at(d: DaemonProcess, model: str) -> float:
    status, body = call(d, "POST", f"/v2/models/{model}/infer",
                        json={"inputs": [{"name": "x_float64", "datatype": "FP64", "shape": [1, 1], "data": [0.0]}]})
    assert status == 200, body
    return body["outputs"][0]["data"][0]


def load(d: DaemonProcess, name: str, source: str | Path | None = None) -> tuple[int, object]:
    params = {"parameters": {"source": str(source)}} if source is not None else {}
    return call(d, "POST", f"/v2/repository/models/{name}/load", json=params)


def spare_ready(d: DaemonProcess) -> bool:
    return spares(d) == 1 and spares_run(d.root)


def spares(d: DaemonProcess) -> int:
    text = call(d, "GET", "/metrics")[1]
    return sum(int(float(line.split()[-1])) for line in text.splitlines()
               if line.startswith("cartonstore_runner_spares{"))


def left_behind(root: Path) -> tuple[list[int], list[str]]:
    slots = root / "run" / "slots"
    return live_pids(str(slots)), sorted(os.listdir(slots)) if slots.is_dir() else []


@pytest.fixture(params=["none", "bwrap"])
def node(request) -> Iterator[tuple[Any, Path, str]]:
    """(daemon factory, base dir): daemons whose runners run unsandboxed or
    under bubblewrap as the runner user (root only)."""
    mode = request.param
    if mode != "none" and (why := why_not(mode)) is not None:
        pytest.skip(why)
    with short_dir() as base:
        base.chmod(0o711)
        started: list[DaemonProcess] = []

        def daemon(settings: str = "") -> DaemonProcess:
            config = base / f"cartonstore{len(started)}.toml"
            user = f'user = "{runner_user().pw_name}"\n' if mode != "none" else ""
            config.write_text(f'[runners]\nsandbox = "{mode}"\n{user}{settings}')
            d = DaemonProcess(base / f"root{len(started)}", extra_args=["--config", str(config)],
                              env={"CARTONSTORE_SANDBOX": mode}, log_file=base / f"daemon{len(started)}.log")
            started.append(d)
            return d.start()
        yield daemon, base, mode
        for d in started:
            if d.proc is not None and d.proc.poll() is None:
                d.stop()
            assert left_behind(d.root) == ([], []), f"left behind by {d.root}"


def test_a_load_takes_the_prewarmed_spare_and_another_starts(node) -> None:
    daemon, base, mode = node
    d = daemon('prewarm = ["python"]\n')
    assert wait_for(lambda: spare_ready(d), timeout=30), "no spare"
    before = time.time()
    status, body = load(d, "m", started_carton(base / "m"))
    assert status == 200, body
    assert started_at(d, "m") < before, "the model's runner started after the load was asked for"
    index = {row["name"]: row for row in call(d, "POST", "/v2/repository/index", json={})[1]}
    assert index["m"]["sandbox"].split("+")[0] == mode
    assert wait_for(lambda: spare_ready(d), timeout=30), "no spare after the load took one"
    # Another version of the model, by name: the new spare serves it; the old runner stops.
    before = time.time()
    status, body = load(d, "m2", started_carton(base / "m2", startup="x = 2"))
    assert status == 200, body
    assert started_at(d, "m2") < before
    assert started_at(d, "m") < started_at(d, "m2")
    d.stop()
    assert left_behind(d.root) == ([], [])


def test_a_taken_spare_is_replaced_once_the_load_that_took_it_is_ready(node) -> None:
    """The replacement is not started while the load that took the spare
    still loads its model: its imports would take CPU from that load."""
    daemon, base, _ = node
    d = daemon('prewarm = ["python"]\n')
    assert wait_for(lambda: spare_ready(d), timeout=30), "no spare"
    slots = str(d.root / "run" / "slots")
    waiting = set(live_pids(slots))
    asked = time.time()
    status, body = load(d, "m", started_carton(base / "m", startup="time.sleep(2.0)"))   # 2 s to load its model
    assert status == 200, body
    ready = time.time()
    ready_since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)   # the clock /proc's start times count on
    assert ready - asked >= 2.0 and started_at(d, "m") < asked   # the spare took the load, and took its time
    assert wait_for(lambda: spare_ready(d), timeout=30), "no spare after the load was ready"
    serving = {row["name"]: row for row in call(d, "POST", "/v2/repository/index", json={})[1]}["m"]["pids"]
    new = [pid for pid in set(live_pids(slots)) - waiting if pid not in serving]
    assert new, "no new spare process"
    # 0.5 s is a margin, the 2 s load the difference
    assert min(started_since_boot(pid) for pid in new) > ready_since_boot - 0.5, (ready - asked, [
        ready_since_boot - started_since_boot(pid) for pid in new])


def test_a_daemon_stopped_as_a_refill_starts_leaves_nothing(node) -> None:
    """The replacement spare starts the moment a load that took one is
    ready: a daemon stopped right then ends it and removes its slot."""
    daemon, base, _ = node
    for round_ in range(3):
        d = daemon('prewarm = ["python"]\n')
        assert wait_for(lambda: spare_ready(d), timeout=30), "no spare"  # noqa: B023 - called within this round
        status, body = load(d, "m", started_carton(base / f"m{round_}"))
        assert status == 200, body
        d.stop()
        assert left_behind(d.root) == ([], []), f"round {round_}"


def test_loading_again_what_already_serves_starts_no_runner(node) -> None:
    """The same source and config again: the version serves as asked, so
    neither the spare nor a runner started early is taken and thrown away."""
    daemon, base, _ = node
    d = daemon('prewarm = ["python"]\n')
    assert wait_for(lambda: spare_ready(d), timeout=30), "no spare"
    source = started_carton(base / "m")
    assert load(d, "m", source)[0] == 200
    assert wait_for(lambda: spare_ready(d), timeout=30), "no spare after the load took one"
    slots = str(d.root / "run" / "slots")
    settled = sorted(live_pids(slots))   # the model's runner and the new spare
    served_by = started_at(d, "m")
    for _ in range(3):
        status, body = load(d, "m", source)
        assert status == 200, body
    time.sleep(0.5)   # nothing to wait for: the time a spare thrown away would take to be ended and replaced
    assert sorted(live_pids(slots)) == settled
    assert started_at(d, "m") == pytest.approx(served_by, abs=0.01)   # the same process
    assert spare_ready(d)


def test_an_onnx_model_loads_into_an_onnx_spare(node) -> None:
    """The onnx kind's spare has imported onnxruntime while it waited
    (onnx.warm); the model's runner is that process."""
    pytest.importorskip("onnxruntime")
    daemon, base, _ = node
    d = daemon('prewarm = ["onnx"]\n')
    assert wait_for(lambda: spare_ready(d), timeout=60), "no onnx spare"
    waiting = set(live_pids(str(d.root / "run" / "slots")))
    assert load(d, "affine", onnx_carton(base / "affine"))[0] == 200
    row = {r["name"]: r for r in call(d, "POST", "/v2/repository/index", json={})[1]}["affine"]
    assert set(row["pids"]) <= waiting, (row["pids"], waiting)
    status, body = call(d, "POST", "/v2/models/affine/infer", json={"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    assert status == 200 and body["outputs"][0]["data"] == [3, 5, 7, 9], body


def test_a_spare_that_dies_is_replaced(node) -> None:
    daemon, base, _ = node
    d = daemon('prewarm = ["python"]\nrestart_backoff = "100ms"\n')
    assert wait_for(lambda: spare_ready(d), timeout=30)   # counted once spawned; its processes a moment later
    first = live_pids(str(d.root / "run" / "slots"))
    assert first
    for pid in first:   # under bubblewrap: setpriv, bwrap and the runner; one's death may end the others first
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: spares(d) == 1 and not set(live_pids(str(d.root / "run" / "slots"))) & set(first),
                    timeout=30), "the dead spare was not replaced"
    status, body = load(d, "m", started_carton(base / "m"))
    assert status == 200, body
    assert started_at(d, "m") > 0


def test_a_model_that_fails_in_a_spare_fails_its_load_by_name(node) -> None:
    daemon, base, _ = node
    d = daemon('prewarm = ["python"]\n')
    assert wait_for(lambda: spares(d) == 1, timeout=30)
    status, body = load(d, "bad", started_carton(base / "bad", startup="raise RuntimeError('weights are gone')"))
    assert status == 400 and "weights are gone" in json.dumps(body), body
    assert wait_for(lambda: spares(d) == 1, timeout=30)
    status, body = load(d, "m", started_carton(base / "m"))
    assert status == 200, body


def links_carton(base: Path, origin: Origin, *, startup: str = "pass") -> tuple[str, str]:
    """A carton whose 4 MiB weights file is a LINK to the origin, which
    answers for it only after a delay: its URL, and the weights' path there."""
    src = started_carton(base / "links-src", startup=startup, weights=4 << 20)
    served = base / "served"
    (served / "blobs").mkdir(parents=True)
    data = (src / "model" / "weights.bin").read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    origin.put(f"/blobs/{digest}", data)
    pack_directory(src, served / "m.carton", link_prefix=origin.url("/blobs"), link_min_size=1 << 20)
    origin.put_file("/m.carton", served / "m.carton")
    origin.set_fault(f"/blobs/{digest}", Fault(delay=2.0))
    return origin.url("/m.carton"), f"/blobs/{digest}"


def test_a_load_by_url_starts_its_runner_while_the_blobs_come(node) -> None:
    daemon, base, _ = node
    d = daemon()
    with Origin() as origin:
        url, _ = links_carton(base, origin)
        before = time.time()
        status, body = load(d, "m", url)
        took = time.time() - before
    assert status == 200, body
    assert took >= 2.0, "the origin's delay did not hold the load"
    # Started at once, not after the 2 s the weights took to come.
    assert started_at(d, "m") - before < 1.5, (started_at(d, "m") - before, took)


def test_a_load_whose_blobs_fail_ends_the_runner_it_started(node) -> None:
    daemon, base, _ = node
    d = daemon()
    with Origin() as origin:
        url, blob = links_carton(base, origin)
        origin.set_fault(blob, Fault(delay=1.5, status_sequence=[404] * 20))
        with ThreadPoolExecutor(1) as pool:
            loading = pool.submit(load, d, "m", url)
            # its runner is up while the origin keeps it waiting
            assert wait_for(lambda: live_pids(str(d.root / "run" / "slots")), timeout=10)
            status, body = loading.result()
    assert status in (400, 404, 502, 503), body
    assert wait_for(lambda: left_behind(d.root) == ([], []), timeout=10), left_behind(d.root)
    index = {row["name"]: row for row in call(d, "POST", "/v2/repository/index", json={})[1]}
    assert index.get("m", {}).get("state") != "READY"


def test_concurrent_loads_share_out_one_spare(node) -> None:
    """Three loads at once and one spare: one takes it, the others start
    runners of their own; each serves its own model, and nothing is left."""
    daemon, base, _ = node
    d = daemon('prewarm = ["python"]\n')
    assert wait_for(lambda: spare_ready(d), timeout=30)
    names = ["a", "b", "c"]
    sources = {n: started_carton(base / n, startup=f"x = {n!r}") for n in names}
    before = time.time()
    answers = all_at_once([lambda n=n: load(d, n, sources[n]) for n in names])
    assert [status for status, _ in answers] == [200, 200, 200], answers
    started = sorted(started_at(d, n) for n in names)
    assert started[0] < before, "no load took the spare"
    rows = {row["name"]: row for row in call(d, "POST", "/v2/repository/index", json={})[1]}
    pids = [rows[n]["pids"][0] for n in names]
    assert len(set(pids)) == 3 and None not in pids, rows


def test_slots_of_a_daemon_that_is_gone_are_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    """Daemons may share a store root (containers too, each its own pid 1):
    each names its slots for its owner token in the store's tmp/, held by a
    flock, and a starting one removes only those whose owner is gone."""
    import fcntl

    from cartonstore.server.runner_processes.waiting import Slots, slots_dir

    run_dir, tmp_dir = tmp_path / "run" / "runners", tmp_path / "tmp"
    run_dir.mkdir(parents=True)
    tmp_dir.mkdir()
    held = os.open(tmp_dir / "owner-0123456789ab.lock", os.O_RDWR | os.O_CREAT, 0o644)   # a live daemon's
    fcntl.flock(held, fcntl.LOCK_SH)
    (tmp_dir / "owner-ba9876543210.lock").touch()   # a gone daemon's: nobody holds it
    slots = slots_dir(run_dir)
    slots.mkdir()
    dead = slots / "ba9876543210-m.g1-abc-0-1234abcd"
    live = slots / "0123456789ab-n.g1-def-0-5678abcd"
    ours = slots / "aaaaaaaaaaaa-o.g1-012-0-9abcdef0"   # an earlier daemon's, whose lock gc already removed
    odd = slots / "not-a-slot"
    for slot in (dead, live, ours, odd):
        (slot / "model").mkdir(parents=True)
        (slot / "model" / "w.bin").write_bytes(b"w")
        (slot / "model").chmod(0o555)
    try:
        room = Slots(slots, tmp_dir)
        assert sorted(room.prepare()) == sorted([dead, ours, odd])
        assert sorted(slots.iterdir()) == [live]
        mine = room.new("p.g1-x-0")
        assert mine.parent == slots and mine.name.split("-", 1)[0] in {p.name[6:18] for p in tmp_dir.iterdir()}
        mine.mkdir()
        assert sorted(Slots(slots, tmp_dir).prepare()) == []   # this process's own slot: its owner is alive
    finally:
        os.close(held)
    assert oct(slots.stat().st_mode & 0o777) == "0o711"
