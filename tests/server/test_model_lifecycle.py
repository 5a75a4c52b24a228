"""Models that come and go: keep_alive (0, 2 s, -1), runners.max_loaded
(least recently used idle model unloaded first, never one with a request
in flight or keep_alive -1, else 503 naming the holders) and
runners.max_memory (the same, measured after a load's runners are ready;
models of about 85 MiB, 48 MiB of it allocated at load, against a budget
of 2.5 of them, rather than the issue's 800 MiB in 2 GiB: the suite stays
small) and runners.load_on_demand (16 concurrent first requests over HTTP
and gRPC share one load; runners.load_wait bounds the wait). Real daemons,
real python runners, stock tritonclient."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from conftest import short_dir
from kit.daemonkit import DaemonProcess, call, wait_for
from kit.inferkit import echo_toml, in_flight, runner_pids
from tritonclient.utils import InferenceServerException

from cartonstore.system.memory_use import tree_rss

# Echoes x_float32; a first value > 0 is how many seconds to take first (a request held in flight).
SLOW_MAIN = '''
import time


class Slow:
    def infer_with_tensors(self, tensors):
        x = tensors["x_float32"]
        if x.size and x.flat[0] > 0:
            time.sleep(float(x.flat[0]))
        return {"y_float32": x}


def get_model():
    {startup}
    return Slow()
'''

BALLAST = "global BALLAST; BALLAST = bytearray(b'\\x01') * (48 << 20)"   # resident: every page written

CONFIG = """
[runners]
max_loaded = 2
load_on_demand = true
stop_grace = "2s"
"""


def slow_carton(dest: Path, label: str, startup: str = "pass") -> Path:
    (dest / "model").mkdir(parents=True, exist_ok=True)
    (dest / "carton.toml").write_text(echo_toml(dtypes=["float32"]))
    (dest / "model" / "main.py").write_text(SLOW_MAIN.replace("{startup}", startup) + f"\nLABEL = {label!r}\n")
    return dest


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[DaemonProcess, Path]]:
    with short_dir() as base:
        config = base / "cartonstore.toml"
        config.write_text(CONFIG)
        d = DaemonProcess(base / "root", extra_args=["--config", str(config)], log_file=base / "daemon.log").start()
        yield d, base
        d.stop()
        assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)


@pytest.fixture
def daemon(served: tuple[DaemonProcess, Path]) -> DaemonProcess:
    """The module's daemon with nothing loaded."""
    d = served[0]
    for name, row in index(d).items():
        if row["state"] != "UNAVAILABLE":
            assert call(d, "POST", f"/v2/repository/models/{name}/unload", json={})[0] == 200
    return d


def load(d: DaemonProcess, name: str, source: Path | None = None, **params: Any) -> tuple[int, Any]:
    body = {"parameters": {**({"source": str(source)} if source else {}), **params}}
    return call(d, "POST", f"/v2/repository/models/{name}/load", json=body)


def index(d: DaemonProcess) -> dict[str, dict]:
    status, rows = call(d, "POST", "/v2/repository/index", json={})
    assert status == 200
    return {row["name"]: row for row in rows}  # type: ignore[union-attr]  # a list of rows


def infer(client: Any, module: Any, name: str, value: float = 0.0) -> np.ndarray:
    x = module.InferInput("x_float32", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return client.infer(name, [x]).as_numpy("y_float32")


def http_infer(d: DaemonProcess, name: str, value: float = 0.0) -> np.ndarray:
    client = th.InferenceServerClient(d.host_port, network_timeout=120.0, connection_timeout=120.0)
    try:
        return infer(client, th, name, value)
    finally:
        client.close()


def unloads(d: DaemonProcess, reason: str) -> float:
    text = call(d, "GET", "/metrics")[1]
    return sum(float(line.split()[-1]) for line in text.splitlines()  # type: ignore[union-attr]  # text
               if line.startswith(f'cartonstore_model_unloads_total{{reason="{reason}"}}'))


def runner_starts(base: Path, name: str) -> int:
    text = (base / "daemon.log").read_text(errors="replace")
    return sum(1 for line in text.splitlines() if f"model {name} version " in line and ": starting 1 python" in line)


def test_keep_alive_zero_two_seconds_and_forever(daemon: DaemonProcess, tmp_path: Path) -> None:
    idle_before = unloads(daemon, "idle")
    for name, keep in (("ka-zero", 0), ("ka-two", "2s"), ("ka-forever", -1)):
        status, body = load(daemon, name, slow_carton(tmp_path / name, name), keep_alive=keep)
        assert status == 200, body
    rows = index(daemon)
    assert "unload_at" not in rows["ka-forever"]
    assert time.time() < rows["ka-two"]["unload_at"] <= time.time() + 2.5
    first_due = rows["ka-two"]["unload_at"]

    # 0: unloaded as soon as no request is in flight (its load is no request: at once); an infer loads it
    # again on demand, with its keep_alive, and once answered it goes again
    assert wait_for(lambda: index(daemon)["ka-zero"]["reason"] == "unloaded: idle past its keep_alive 0s", 20)
    row = index(daemon)["ka-zero"]
    assert row["state"] == "UNAVAILABLE" and "unload_at" not in row and "pids" not in row
    assert http_infer(daemon, "ka-zero", 1.0).tolist() == [[1.0]]
    assert wait_for(lambda: index(daemon)["ka-zero"]["reason"] == "unloaded: idle past its keep_alive 0s", 20)

    # 2 s: a request puts its unload off, then it goes
    time.sleep(0.5)
    http_infer(daemon, "ka-two")
    assert index(daemon)["ka-two"]["unload_at"] > first_due
    assert wait_for(lambda: index(daemon)["ka-two"]["reason"] == "unloaded: idle past its keep_alive 2s", 20)

    # -1: still serving after the 2 s one went
    assert index(daemon)["ka-forever"]["state"] == "READY"
    assert unloads(daemon, "idle") == idle_before + 3

    # an unloaded model loads again by its name alone
    status, body = load(daemon, "ka-two")
    assert status == 200, body
    assert index(daemon)["ka-two"]["state"] == "READY"


@pytest.mark.parametrize(("value", "fragment"), [
    ("soon", "got 'soon'"), ("-x", "got '-x'"), (True, "got True"), ({"s": 1}, "got {'s': 1}"),
])
def test_a_bad_keep_alive_is_refused_by_name(daemon: DaemonProcess, tmp_path: Path, value: object,
                                            fragment: str) -> None:
    status, body = load(daemon, "ka-bad", slow_carton(tmp_path / "bad", "bad"), keep_alive=value)
    assert status == 400, body
    assert body["error"] == ("parameter 'keep_alive': expected a keep_alive such as 5m, 30s, 0 (unload once "  # type: ignore[index]  # an error body
                             f"answered) or -1 (forever), {fragment}")
    assert "ka-bad" not in index(daemon)   # nothing added, nothing loaded


def three_take_turns(d: DaemonProcess, sources: dict[str, Path], limit: str) -> str:
    """Three models under a budget of two (``limit`` names it): the least
    recently used idle one goes first, never one with a request in flight
    nor one with keep_alive -1; when only such are left, the third load is
    refused and its runners stop. Its refusal."""
    a, b, c = sources
    assert load(d, a, sources[a])[0] == 200
    assert load(d, b, sources[b])[0] == 200
    http_infer(d, a)                  # b is now the least recently used
    assert load(d, c, sources[c])[0] == 200
    rows = index(d)
    assert (rows[a]["state"], rows[b]["state"], rows[c]["state"]) == ("READY", "UNAVAILABLE", "READY")
    assert rows[b]["reason"] == f"unloaded: least recently used idle model, for {c!r} ({limit})"

    # a holds a request (it became the least recently used when it started): c goes instead
    held: list[Any] = []
    holder = threading.Thread(target=lambda: held.append(http_infer(d, a, 4.0)))
    holder.start()
    try:
        assert wait_for(lambda: in_flight(d, a) == 1, 20)
        http_infer(d, c)
        status, body = load(d, b, keep_alive=-1)
        assert status == 200, body
        rows = index(d)
        assert (rows[a]["state"], rows[b]["state"], rows[c]["state"]) == ("READY", "READY", "UNAVAILABLE")
        status, body = load(d, c)     # nothing idle can go
        assert status == 503, body
        row = index(d)[c]
        assert row["state"] == "UNAVAILABLE" and "pids" not in row   # its runner stopped
    finally:
        holder.join(30)
    assert held and held[0].tolist() == [[4.0]]   # the request in flight was answered
    return str(body["error"])  # type: ignore[index]  # an error body


def test_max_loaded_unloads_the_least_recently_used_idle_model(daemon: DaemonProcess, tmp_path: Path) -> None:
    before = unloads(daemon, "max_loaded")
    refusal = three_take_turns(daemon, {name: slow_carton(tmp_path / name, name) for name in ("m1", "m2", "m3")},
                               "runners.max_loaded 2")
    assert refusal == ("failed to load 'm3': runners.max_loaded 2 reached and no loaded model is idle to unload: "
                       "held by m1 (1 request(s) in flight), m2 (keep_alive -1)")
    assert unloads(daemon, "max_loaded") == before + 2


def test_max_memory_unloads_the_least_recently_used_idle_model(served: tuple[DaemonProcess, Path],
                                                              tmp_path: Path) -> None:
    sources = {name: slow_carton(tmp_path / name, name, startup=BALLAST) for name in ("b1", "b2", "b3")}
    sizer = served[0]   # what one such runner holds here, measured as the daemon will
    assert load(sizer, "sized", sources["b1"])[0] == 200
    one = sum(tree_rss(index(sizer)["sized"]["pids"]).values())
    assert call(sizer, "POST", "/v2/repository/models/sized/unload", json={})[0] == 200
    budget = int(2.5 * one) >> 20
    with short_dir() as base:
        config = base / "cartonstore.toml"
        config.write_text(f'[runners]\nmax_memory = "{budget}MiB"\nstop_grace = "2s"\n')
        d = DaemonProcess(base / "root", extra_args=["--config", str(config)]).start()
        try:
            refusal = three_take_turns(d, sources, f"runners.max_memory {budget}MiB")
            assert re.fullmatch(
                rf"failed to load 'b3': runners.max_memory {budget}MiB exceeded: the runners hold [0-9.]+ MiB, "
                r"[0-9.]+ MiB of it for 'b3', and no loaded model is idle to unload: held by "
                r"b1 [0-9.]+ MiB \(1 request\(s\) in flight\), b2 [0-9.]+ MiB \(keep_alive -1\)", refusal), refusal
            metrics = call(d, "GET", "/metrics")[1]
            assert 'cartonstore_model_unloads_total{reason="max_memory"} 2.0' in metrics  # type: ignore[operator]  # text
        finally:
            d.stop()
        assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)


def test_sixteen_first_requests_share_one_load_on_demand(served: tuple[DaemonProcess, Path],
                                                         daemon: DaemonProcess, tmp_path: Path) -> None:
    base = served[1]
    assert load(daemon, "od", slow_carton(tmp_path / "od", "od"), keep_alive="1h")[0] == 200
    assert call(daemon, "POST", "/v2/repository/models/od/unload", json={})[0] == 200
    starts = runner_starts(base, "od")
    results: list[Any] = []

    def one(i: int) -> None:
        if i % 2:
            results.append(http_infer(daemon, "od", 0.0))
            return
        client = tg.InferenceServerClient(daemon.grpc_unix)
        try:
            results.append(infer(client, tg, "od", 0.0))
        finally:
            client.close()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 16 and all(r.tolist() == [[0.0]] for r in results)
    assert runner_starts(base, "od") == starts + 1   # one load, one runner start
    row = index(daemon)["od"]
    assert row["state"] == "READY" and row["unload_at"] > time.time() + 3000   # its last load's keep_alive

    # a name the store does not hold is refused as without load_on_demand
    with pytest.raises(InferenceServerException, match=r"Request for unknown model: 'nope' is not found: "
                                                       r"model 'nope' is not loaded; load it first"):
        http_infer(daemon, "nope")
    assert "nope" not in index(daemon)


def test_a_load_on_demand_past_load_wait_is_refused_naming_the_wait(tmp_path: Path) -> None:
    with short_dir() as base:
        config = base / "cartonstore.toml"
        config.write_text('[runners]\nload_on_demand = true\nload_wait = "1s"\nstop_grace = "1s"\n')
        d = DaemonProcess(base / "root", extra_args=["--config", str(config)]).start()
        try:
            # in the store, never loaded: its first infer loads it, and its runner takes 4 s to start
            source = slow_carton(tmp_path / "late", "late", startup="import time; time.sleep(4)")
            subprocess.run([sys.executable, "-m", "cartonstore.cli", "add", "--root", str(d.root), "--name", "late",
                            str(source)], check=True, capture_output=True)
            status, body = call(d, "POST", "/v2/models/late/infer", data=json.dumps(
                {"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]}))
            assert status == 503
            assert body["error"] == ("model 'late' is still loading on demand after runners.load_wait 1s; "  # type: ignore[index]  # an error body
                                     "retry later")
            assert wait_for(lambda: index(d)["late"]["state"] == "READY", 60)   # the load went on
        finally:
            d.stop()
        assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)
