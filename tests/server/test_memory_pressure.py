"""Memory pressure unloads the coldest idle model (runners.pressure_cgroups,
pressure_psi) before the OOM killer picks a process. A real daemon whose
runners each have a cgroup with a memory_limit; one model, asked to, reads
a file bigger than its limit into the page cache, so the kernel reclaims
to keep its cgroup under the limit (cgroup v2 memory.events max, v1
memory.pressure_level notifications) and nothing is OOM-killed: the least recently used
idle model is unloaded with reason pressure and counted, the model with a
request in flight and the one with keep_alive -1 are not. The readers of
the kernel's files are checked on files in their formats."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th
from conftest import short_dir
from kit.daemonkit import DaemonProcess, call, wait_for
from kit.inferkit import runner_pids
from kit.runnerkit import carton_toml
from kit.sandboxkit import runner_user, why_not

from cartonstore.system.memory_pressure import LimitReclaims, host_memory_psi, limit_hits_v2, psi_some_avg10
from cartonstore.system.memory_use import cgroup_bytes

LIMIT_MIB = 128
BLOB_MIB = 192   # read through the page cache by a runner limited to LIMIT_MIB: reclaim must run

READER = '''
import os
import numpy as np

BLOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blob.bin")

class Reader:
    def infer_with_tensors(self, tensors):
        read = 0
        if int(tensors["x"][0]):
            fd = os.open(BLOB, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)   # its pages are charged to this cgroup
                while chunk := os.read(fd, 1 << 20):
                    read += len(chunk)
            finally:
                os.close(fd)
        return {"y": np.array([read], dtype=np.int64)}

def get_model():
    return Reader()
'''


def _carton(dest: Path, blob_mib: int = 0) -> Path:
    (dest / "model").mkdir(parents=True, exist_ok=True)
    (dest / "model" / "main.py").write_text(READER)
    with open(dest / "model" / "blob.bin", "wb") as f:
        f.truncate(blob_mib << 20)
        f.write(b"cartonstore")   # not all one hole: stored as a file like any other
    (dest / "carton.toml").write_text(carton_toml(
        "python", ">=3.8", {"entrypoint_package": "main", "entrypoint_fn": "get_model"}, model_name=dest.name,
        inputs=[("x", "int32", [1])], outputs=[("y", "int64", [1])]))
    return dest


@pytest.fixture(scope="module")
def pressured() -> Iterator[tuple[DaemonProcess, Path]]:
    if (why := why_not("bwrap")) is not None:   # a runner's cgroup comes with its sandbox
        pytest.skip(why)
    with short_dir() as base:
        base.chmod(0o711)
        (base / "cartonstore.toml").write_text(f'[runners]\nsandbox = "bwrap"\nuser = "{runner_user().pw_name}"\n'  # type: ignore[union-attr]  # why_not: there is one
                                               f'memory_limit = "{LIMIT_MIB}MiB"\npressure_cgroups = true\n')
        d = DaemonProcess(base / "root", extra_args=["--config", str(base / "cartonstore.toml")],
                          env={"CARTONSTORE_SANDBOX": "bwrap"}, log_file=base / "daemon.log").start()
        yield d, base
        d.stop()
        assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)


def _load(d: DaemonProcess, name: str, source: Path, **params: str) -> None:
    status, body = call(d, "POST", f"/v2/repository/models/{name}/load",
                        json={"parameters": {"source": str(source), **params}})
    assert status == 200, body


def _rows(d: DaemonProcess) -> dict[str, dict]:
    status, rows = call(d, "POST", "/v2/repository/index", json={})
    assert status == 200 and isinstance(rows, list), rows
    return {r["name"]: r for r in rows}


def _unloads(d: DaemonProcess, reason: str) -> float:
    status, text = call(d, "GET", "/metrics")
    assert status == 200 and isinstance(text, str)
    found = re.search(rf'^cartonstore_model_unloads_total\{{reason="{reason}"\}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_a_runner_at_its_memory_limit_unloads_the_coldest_idle_model(pressured: tuple[DaemonProcess, Path]) -> None:
    d, base = pressured
    small = _carton(base / "small")
    _load(d, "cold", small)
    _load(d, "kept", small, keep_alive="-1")
    _load(d, "reader", _carton(base / "reader", BLOB_MIB))
    sandbox = _rows(d)["reader"].get("sandbox", "")
    if "cgroup:memory" not in sandbox:
        pytest.skip(f"no writable memory cgroup for runners here (their sandbox: {sandbox!r})")
    time.sleep(1.5)   # a cgroup's first reading is the watcher's baseline: one tick (1 s) passes first
    os.sync()   # the blob's pages clean, so that the runner's fadvise can drop them
    c = th.InferenceServerClient(d.host_port, network_timeout=120)
    try:
        x = th.InferInput("x", [1], "INT32")
        x.set_data_from_numpy(np.array([1], dtype=np.int32))
        assert int(c.infer("reader", [x]).as_numpy("y")[0]) >= BLOB_MIB << 20
    finally:
        c.close()
    assert wait_for(lambda: _rows(d)["cold"]["state"] == "UNAVAILABLE", 15), _rows(d)
    rows = _rows(d)
    assert "under memory pressure (the runner cgroup of reader at its memory limit: reclaimed" in rows["cold"]["reason"], rows
    assert rows["kept"]["state"] == "READY" and rows["reader"]["state"] == "READY", rows
    assert _unloads(d, "pressure") == 1.0
    log = d.log_file.read_text() if d.log_file else ""
    assert re.search(r"memory pressure \(the runner cgroup of reader at its memory limit: reclaimed \d+ time\(s\)\): "
                     r"unloading cold", log), log[-2000:]
    assert "OOM" not in json.dumps(rows)


def test_the_readers_of_the_kernels_files(tmp_path: Path) -> None:
    psi = tmp_path / "memory"
    psi.write_text("some avg10=12.50 avg60=3.00 avg300=0.50 total=123456\n"
                   "full avg10=1.00 avg60=0.10 avg300=0.00 total=2345\n")
    assert host_memory_psi(psi) == 12.5
    assert host_memory_psi(tmp_path / "absent") is None
    assert psi_some_avg10("full avg10=1.00\n") is None
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 7\nmax 3\noom 0\noom_kill 0\noom_group_kill 0\n")
    reclaims = LimitReclaims()
    try:   # a directory that is no cgroup (no memory.pressure_level to register) is left out
        assert reclaims.read([v2, tmp_path]) == {v2: 10}
    finally:
        reclaims.close()
    assert limit_hits_v2("oom 1\n") is None


def test_a_cgroups_charge_is_read_on_v2_and_v1(tmp_path: Path) -> None:
    """max_memory and pressure read the same cgroup of a runner, v2 or v1."""
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir()
    v1.mkdir()
    (v2 / "memory.current").write_text("4096\n")
    (v1 / "memory.usage_in_bytes").write_text("8192\n")
    assert (cgroup_bytes(v2), cgroup_bytes(v1), cgroup_bytes(tmp_path)) == (4096, 8192, None)
