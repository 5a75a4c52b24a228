"""Loaded models survive a restart: a real `cartonstore serve` killed with
SIGKILL and started again on the same socket loads again, without a load
call, what it had loaded (each version with its load's config), not what
was unloaded; a model that fails to load again is UNAVAILABLE with the
reason while the others serve; --no-restore loads nothing."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from kit.daemonkit import DaemonProcess, call, wait_for
from kit.inferkit import echo_carton, onnx_carton, runner_pids

from cartonstore.cli.commands import main

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("restore")]


def _add(root: Path, src: Path, name: str) -> None:
    assert main(["add", str(src), "--name", name, "--root", str(root), "--progress", "none"]) == 0


def _ready(d: DaemonProcess, timeout: float = 60.0) -> float:
    """Seconds until /v2/health/ready answers 200."""
    started = time.monotonic()
    assert wait_for(lambda: call(d, "GET", "/v2/health/ready")[0] == 200, timeout), \
        f"the daemon was not ready in {timeout} s"
    return time.monotonic() - started


def _states(d: DaemonProcess) -> dict[str, tuple[str, str]]:
    status, rows = call(d, "POST", "/v2/repository/index", json={})
    assert status == 200
    return {r["name"]: (r["state"], r.get("reason", "")) for r in rows}


def test_a_killed_daemon_serves_its_loaded_models_again(short_tmp: Path, capsys) -> None:
    root, marker = short_tmp / "root", short_tmp / "broken"
    src = short_tmp / "src"
    sources = {"a": echo_carton(src / "a", dtypes=["float32"]),
               "b": echo_carton(src / "b", label="b", dtypes=["float32"]),
               "affine": onnx_carton(src / "affine"),
               "gone": echo_carton(src / "gone", label="gone", dtypes=["float32"]),
               "flaky": echo_carton(src / "flaky", label="flaky", dtypes=["float32"],
                                    startup=f"assert not __import__('os').path.exists({str(marker)!r}), 'broken'")}
    for name, path in sources.items():
        _add(root, path, name)
    capsys.readouterr()
    d = DaemonProcess(root).start()
    try:
        c = triton.InferenceServerClient(d.host_port)
        c.load_model("a")
        c.load_model("b", config=json.dumps({"max_batch_size": 4}))
        c.load_model("affine", config=json.dumps({"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}))
        c.load_model("gone")
        c.load_model("flaky")
        c.unload_model("gone")
        assert len(runner_pids(root)) == 5
        c.close()
    finally:
        d.stop(signal.SIGKILL)
    assert wait_for(lambda: not runner_pids(root)), runner_pids(root)   # they die with their daemon

    marker.write_text("")   # flaky cannot start any more
    d = DaemonProcess(root).start()   # live at once: READY=1 before the models are back
    try:
        _ready(d)
        states = _states(d)
        assert {n: s for n, (s, _) in states.items()} == {"a": "READY", "b": "READY", "affine": "READY",
                                                           "gone": "UNAVAILABLE", "flaky": "UNAVAILABLE"}
        assert states["gone"][1] == "not loaded"
        assert "failed to start" in states["flaky"][1] and "broken" in states["flaky"][1]
        c = triton.InferenceServerClient(d.host_port)
        assert c.get_model_config("b")["max_batch_size"] == 4
        assert c.get_model_config("affine")["instance_group"][0]["count"] == 2
        x = triton.InferInput("x", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert (c.infer("affine", [x]).as_numpy("y") == 3).all()
        y = triton.InferInput("x_float32", [2, 2], "FP32")
        y.set_data_from_numpy(np.full((2, 2), 7, np.float32))
        assert (c.infer("a", [y]).as_numpy("y_float32") == 7).all()
        c.close()
        assert len(runner_pids(root)) == 4    # a, b and two of affine
    finally:
        d.stop()
    assert not runner_pids(root)

    d = DaemonProcess(root, extra_args=["--no-restore"]).start()
    try:
        _ready(d, timeout=5)
        assert {s for s, _ in _states(d).values()} == {"UNAVAILABLE"} and not runner_pids(root)
    finally:
        d.stop()
    marker.unlink()   # a later start restores again: --no-restore skipped it once, forgetting nothing
    d = DaemonProcess(root).start()
    try:
        _ready(d)
        assert {n for n, (s, _) in _states(d).items() if s == "READY"} == {"a", "b", "affine", "flaky"}
    finally:
        d.stop()
    assert not runner_pids(root)


def test_a_callers_load_or_cli_command_during_a_restore_is_not_undone(short_tmp: Path, capsys) -> None:
    """What a caller asks while the daemon is still loading models again
    stands: a load with another config is not replaced by the restore's,
    and `infer --unload-after` neither loads nor unloads a model the
    restore brings back (it waits for the daemon to be ready)."""
    from cartonstore.cli.commands import main

    root = short_tmp / "root"
    slow = "import time; time.sleep(1.0)"
    _add(root, echo_carton(short_tmp / "src" / "b", label="b", startup=slow, dtypes=["float32"]), "b")
    _add(root, echo_carton(short_tmp / "src" / "c", label="c", startup=slow, dtypes=["float32"]), "c")
    capsys.readouterr()
    d = DaemonProcess(root).start()
    try:
        assert call(d, "POST", "/v2/repository/models/b/load",
                    json={"parameters": {"config": json.dumps({"max_batch_size": 4})}})[0] == 200
        assert call(d, "POST", "/v2/repository/models/c/load", json={})[0] == 200
    finally:
        d.stop(signal.SIGKILL)
    assert wait_for(lambda: not runner_pids(root)), runner_pids(root)

    d = DaemonProcess(root).start()
    try:   # at once, while b and c are being loaded again
        status, body = call(d, "POST", "/v2/repository/models/b/load",
                            json={"parameters": {"config": json.dumps({"max_batch_size": 2})}})
        assert status == 200, body
        assert main(["infer", "c", "--input", "x_float32=[[1]]", "--root", str(root), "--json",
                     "--unload-after"]) == 0
        said = capsys.readouterr()
        assert "loaded_into_daemon" not in json.loads(said.out) and "loaded c" not in said.err
        _ready(d)
        assert call(d, "GET", "/v2/models/b/config")[1]["max_batch_size"] == 2
        assert _states(d)["c"][0] == "READY"
    finally:
        d.stop()
    d = DaemonProcess(root).start()   # and the caller's config is the one recorded
    try:
        _ready(d)
        assert call(d, "GET", "/v2/models/b/config")[1]["max_batch_size"] == 2
    finally:
        d.stop()
    assert not runner_pids(root)
