"""Runners under the daemon: failed starts, crashes, hangs, unload during a
request, two loads at once, a version switch under load, and no runner
left behind when the daemon stops (SIGTERM) or dies (SIGKILL)."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kit.daemonkit import DaemonProcess, call, unix_session, wait_for, wait_for_async
from kit.inferkit import echo_carton, in_flight, runner_pids, runner_sockets

FAST = """
[leases]
pin_ttl = "3s"

[runners]
ready_timeout = "20s"
request_timeout = "3s"
stop_grace = "5s"
max_restarts = 3
restart_backoff = "100ms"
max_inflight = 4
"""


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    config = short_tmp / "cartonstore.toml"
    config.write_text(FAST)
    d = DaemonProcess(short_tmp / "root", extra_args=["--config", str(config)]).start()
    yield d
    d.stop()
    assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)


def echo_body(value: float) -> bytes:
    return json.dumps({"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 1], "data": [value]}]})\
        .encode()


SMALL = {"dtypes": ["float32"]}


async def load(s, name: str, source: Path | None = None, **params: str) -> tuple[int, Any]:
    body = {"parameters": {**({"source": str(source)} if source else {}), **params}}
    r = await s.post(f"/v2/repository/models/{name}/load", json=body)
    return r.status, await r.json()


async def index(s) -> dict[str, dict]:
    r = await s.post("/v2/repository/index", json={})
    return {row["name"]: row for row in await r.json()}


async def infer(s, name: str, value: float = 1.0) -> tuple[int, dict]:
    r = await s.post(f"/v2/models/{name}/infer", data=echo_body(value))
    return r.status, await r.json()


def test_runner_that_fails_to_start_is_unavailable_with_its_stderr(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = echo_carton(tmp_path / "bad", startup="raise SystemExit('cannot open the weights: no such file')", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            status, body = await load(s, "bad", src)
            assert status == 400 and "cannot open the weights" in body["error"]
            row = (await index(s))["bad"]
            assert row["state"] == "UNAVAILABLE" and "cannot open the weights" in row["reason"]
            r = await s.get("/v2/models/bad/ready")
            assert r.status == 400
    asyncio.run(go())
    assert not runner_pids(daemon.root)


def test_framework_requirement_is_checked(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = echo_carton(tmp_path / "old", requirement="=2.7", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            status, body = await load(s, "old", src)
            assert status == 400
            assert "requires python =2.7, but the runner provides 3." in body["error"]
    asyncio.run(go())


def test_files_only_model_loads_and_infer_names_the_missing_runner(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = echo_carton(tmp_path / "exotic", runner="tensorflow", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            status, body = await load(s, "exotic", src)
            assert status == 200, body
            row = (await index(s))["exotic"]
            assert row["state"] == "READY" and "no runner is configured for runner_name 'tensorflow'" in row["reason"]
            r = await s.post("/v1/leases", json={"model": "exotic", "ttl": 30})
            assert r.status == 200  # leases work as before
            status, body = await infer(s, "exotic")
            assert status == 400 and "'tensorflow'" in body["error"]
    asyncio.run(go())


def test_crash_on_request_is_503_and_the_runner_restarts(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = echo_carton(tmp_path / "m", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            assert (await load(s, "m", src))[0] == 200
            pid = runner_pids(daemon.root)
            status, body = await infer(s, "m", -1.0)
            assert status == 503 and "died" in body["error"], body

            async def restarted() -> bool:
                row = (await index(s))["m"]
                return row["state"] == "READY" and row.get("restarts") == 1
            assert await wait_for_async(restarted), (await index(s))["m"]
            assert (await infer(s, "m", 5.0))[0] == 200
            assert runner_pids(daemon.root) != pid
            metrics = await (await s.get("/metrics")).text()
            assert 'cartonstore_runner_restarts_total{model="m"' in metrics
    asyncio.run(go())


def test_hung_request_times_out_and_the_runner_is_replaced(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = echo_carton(tmp_path / "m", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            assert (await load(s, "m", src))[0] == 200
            started = time.monotonic()
            status, body = await infer(s, "m", -2.0)
            assert status == 503 and "did not answer within" in body["error"], body
            assert time.monotonic() - started < 15
            assert wait_for(lambda: len(runner_pids(daemon.root)) == 1, 20)

            async def answers() -> bool:
                return (await infer(s, "m", 1.0))[0] == 200
            assert await wait_for_async(answers, 20, 0.1)
    asyncio.run(go())


def test_unload_waits_for_an_in_flight_request(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = echo_carton(tmp_path / "m", startup="pass", **SMALL)
    slow = tmp_path / "m" / "model" / "main.py"
    slow.write_text(slow.read_text().replace("return {\"y_\"", "time.sleep(1.0)\n        return {\"y_\""))

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            assert (await load(s, "m", src))[0] == 200
            request = asyncio.ensure_future(infer(s, "m", 4.0))
            assert await wait_for_async(lambda: asyncio.to_thread(in_flight, daemon, "m"))
            r = await s.post("/v2/repository/models/m/unload", json={})
            assert r.status == 200
            status, body = await request
            assert status == 200 and body["outputs"][0]["data"] == [4.0]
            assert (await infer(s, "m"))[0] == 400  # unloaded
    asyncio.run(go())
    assert wait_for(lambda: not runner_pids(daemon.root), 10)


def test_two_concurrent_loads_start_one_runner(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = echo_carton(tmp_path / "m", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            results = await asyncio.gather(load(s, "m", src), load(s, "m", src))
            assert [r[0] for r in results] == [200, 200]
    asyncio.run(go())
    assert len(runner_pids(daemon.root)) == 1


def test_version_switch_under_steady_traffic_fails_nothing(daemon: DaemonProcess, tmp_path: Path) -> None:
    v1 = echo_carton(tmp_path / "v1", label="one", **SMALL)
    v2 = echo_carton(tmp_path / "v2", label="two", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            assert (await load(s, "m", v1))[0] == 200
            old = (await index(s))["m"]["version"]
            done = asyncio.Event()
            statuses: list[int] = []

            async def traffic() -> None:
                while not done.is_set():
                    statuses.append((await infer(s, "m", 2.0))[0])

            loops = [asyncio.ensure_future(traffic()) for _ in range(3)]
            assert await wait_for_async(lambda: len(statuses) >= 3)
            assert (await load(s, "m", v2))[0] == 200
            switched = len(statuses)
            assert await wait_for_async(lambda: len(statuses) >= switched + 3)
            done.set()
            await asyncio.gather(*loops)
            assert statuses and set(statuses) == {200}, sorted(set(statuses))
            assert (await index(s))["m"]["version"] != old
    asyncio.run(go())
    assert wait_for(lambda: len(runner_pids(daemon.root)) == 1, 10)


def test_failed_reload_keeps_the_old_version_serving(daemon: DaemonProcess, tmp_path: Path) -> None:
    good = echo_carton(tmp_path / "good", **SMALL)
    bad = echo_carton(tmp_path / "bad", startup="raise SystemExit('broken build')", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            assert (await load(s, "m", good))[0] == 200
            version = (await index(s))["m"]["version"]
            status, body = await load(s, "m", bad)
            assert status == 400 and "broken build" in body["error"]
            row = (await index(s))["m"]
            assert row["state"] == "READY" and row["version"] == version and "broken build" in row["reason"]
            assert (await infer(s, "m", 3.0))[0] == 200
            assert names_and_pins(daemon.root) == ({"m": version}, {"pin:m": version})
    asyncio.run(go())


def names_and_pins(root: Path) -> tuple[dict[str, str], dict[str, str]]:
    conn = sqlite3.connect(root / "index.db")
    try:
        names = dict(conn.execute("SELECT name, carton FROM names"))
        rows = conn.execute("SELECT id, carton FROM leases WHERE id LIKE 'pin:%' OR id LIKE 'switch:%'")
        # "<kind>:<owner token>:<name>" as "<kind>:<name>": one daemon serves the store here
        pins = {f"{kind}:{name}": carton for lease_id, carton in rows for kind, _, name in [lease_id.split(":", 2)]}
        return names, pins
    finally:
        conn.close()


@pytest.mark.slow
def test_pins_follow_a_version_switch(daemon: DaemonProcess, tmp_path: Path) -> None:
    v1 = echo_carton(tmp_path / "v1", label="one", **SMALL)
    v2 = echo_carton(tmp_path / "v2", label="two", startup="import time; time.sleep(2.5)", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            assert (await load(s, "m", v1))[0] == 200
            old = (await index(s))["m"]["version"]
            switching = asyncio.ensure_future(load(s, "m", v2))
            await asyncio.sleep(1.8)  # the old runner serves, the new one starts; pins were renewed meanwhile
            _, pins = names_and_pins(daemon.root)
            assert pins["switch:m"] == old and pins["pin:m"] != old, pins
            assert (await switching)[0] == 200
            new = (await index(s))["m"]["version"]
            await asyncio.sleep(1.5)  # a renewal after the switch
            assert names_and_pins(daemon.root) == ({"m": new}, {"pin:m": new})
            assert (await s.post("/v2/repository/models/m/unload", json={})).status == 200
            await asyncio.sleep(1.5)  # no renewal brings the pin back
            assert names_and_pins(daemon.root)[1] == {}
    asyncio.run(go())


def test_reload_with_a_new_config_keeps_every_instance_reachable(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = echo_carton(tmp_path / "m", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            assert (await load(s, "m", src))[0] == 200
            two = json.dumps({"instance_group": [{"count": 2}]})
            assert (await load(s, "m", src, config=two))[0] == 200
            statuses = await asyncio.gather(*(infer(s, "m", float(i)) for i in range(4)))  # max_inflight 4
            assert [st for st, _ in statuses] == [200] * 4
            assert len(runner_sockets(daemon.root)) == 2
    asyncio.run(go())
    assert len(runner_pids(daemon.root)) == 2


def test_two_names_loaded_from_one_source_both_exist(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = echo_carton(tmp_path / "m", runner="none", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            results = await asyncio.gather(load(s, "alpha", src), load(s, "beta", src))
            assert [r[0] for r in results] == [200, 200]
    asyncio.run(go())
    names, _ = names_and_pins(daemon.root)
    assert names["alpha"] == names["beta"]


def test_busy_model_answers_503_with_retry_after(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = echo_carton(tmp_path / "m", **SMALL)
    slow = tmp_path / "m" / "model" / "main.py"
    slow.write_text(slow.read_text().replace("return {\"y_\"", "time.sleep(0.5)\n        return {\"y_\""))

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            assert (await load(s, "m", src))[0] == 200

            async def one() -> tuple[int, str | None]:
                r = await s.post("/v2/models/m/infer", data=echo_body(1.0))
                return r.status, r.headers.get("Retry-After")

            results = await asyncio.gather(*(one() for _ in range(8)))
            busy = [r for r in results if r[0] == 503]
            assert busy and all(r[1] for r in busy), results
            assert sum(1 for r in results if r[0] == 200) == 4
    asyncio.run(go())


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_runner_outlives_the_daemon(short_tmp: Path, sig: int) -> None:
    d = DaemonProcess(short_tmp / "root").start()
    src = echo_carton(short_tmp / "m", **SMALL)

    async def go() -> None:
        async with unix_session(d.socket_path) as s:
            assert (await load(s, "m", src, config=json.dumps({"instance_group": [{"count": 2}]})))[0] == 200
    try:
        asyncio.run(go())
        assert len(runner_pids(d.root)) == 2
    finally:
        d.stop(sig)
    assert wait_for(lambda: not runner_pids(d.root), 10), runner_pids(d.root)
    if sig == signal.SIGKILL:  # the next daemon cleans the dead runners' sockets
        d2 = DaemonProcess(short_tmp / "root").start()
        try:
            assert not runner_sockets(short_tmp / "root")
        finally:
            d2.stop()


def test_infer_cli_through_the_daemon_and_without_one(daemon: DaemonProcess, short_tmp: Path, capsys) -> None:
    from cartonstore.cli.commands import main

    src = echo_carton(short_tmp / "m", **SMALL)
    root = str(daemon.root)
    assert main(["add", str(src), "--name", "cli", "--root", root, "--progress", "none"]) == 0
    np.save(short_tmp / "x.npy", np.array([[1.5, 2.5]], np.float32))
    capsys.readouterr()
    assert main(["infer", "cli", "--input", f"x_float32={short_tmp / 'x.npy'}", "--root", root, "--json",
                 "--unload-after"]) == 0
    said = capsys.readouterr()
    out = json.loads(said.out)
    assert out["outputs"]["y_float32"] == {"datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}
    assert out["loaded_into_daemon"] and out["unloaded_after"] and "unloading it after" in said.err
    assert call(daemon, "GET", "/v2/models/cli/ready")[0] == 400      # what it loaded, it unloaded
    assert main(["infer", "cli", "--input", "x_float32=[[3]]", "--root", root]) == 0
    assert "loaded cli into the daemon, where it stays loaded" in capsys.readouterr().err
    assert call(daemon, "GET", "/v2/models/cli/ready")[0] == 200
    assert main(["infer", "cli", "--input", "x_float32=[[3]]", "--root", root, "--json", "--unload-after"]) == 0
    said = capsys.readouterr()                                       # loaded before: neither said nor unloaded
    assert "loaded_into_daemon" not in json.loads(said.out) and said.err == ""
    assert call(daemon, "GET", "/v2/models/cli/ready")[0] == 200
    assert main(["infer", "cli", "--input", "x_float32=[[7]]", "--root", root, "--socket",
                 str(short_tmp / "nobody.sock"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outputs"]["y_float32"]["data"] == [7.0]
    assert main(["infer", "cli", "--input", "nope=[1]", "--root", root]) == 4
    assert "has no input 'nope'" in capsys.readouterr().err


def test_a_runners_stderr_reaches_clients_as_lines(daemon: DaemonProcess, short_tmp: Path, capsys) -> None:
    from cartonstore.cli.commands import main

    startup = ("import sys; print('first line', file=sys.stderr); print('second | line', file=sys.stderr); "
               "raise SystemExit(3)")
    src = echo_carton(short_tmp / "m", startup=startup, **SMALL)
    root = str(daemon.root)
    assert main(["add", str(src), "--name", "broken", "--root", root, "--progress", "none"]) == 0
    status, body = call(daemon, "POST", "/v2/repository/models/broken/load", json={})
    assert status == 400 and body["stderr"][-2:] == ["first line", "second | line"]
    assert body["error"].startswith("failed to load 'broken': runner for broken failed to start: exited with "
                                    "status 3; its last stderr lines:\n")
    assert body["error"].endswith("\n  first line\n  second | line")
    capsys.readouterr()
    assert main(["infer", "broken", "--input", "x_float32=[[1]]", "--root", root, "--json"]) == 4
    err = json.loads(capsys.readouterr().err)
    assert err["stderr"][-2:] == ["first line", "second | line"] and "failed to load 'broken'" in err["error"]
    assert main(["selftest", "broken", "--root", root]) == 4
    text = capsys.readouterr().err
    assert text.startswith("cartonstore selftest: error: failed to load 'broken'") and "\n  second | line" in text


def test_unload_during_a_starting_load_waits_then_stops_it(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = echo_carton(tmp_path / "m", startup="import time; time.sleep(1.5)", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            loading = asyncio.ensure_future(load(s, "m", src))
            assert await wait_for_async(lambda: runner_pids(daemon.root))  # the runner is starting
            r = await s.post("/v2/repository/models/m/unload", json={})
            assert r.status == 200
            assert (await loading)[0] == 200  # the load finished first; the unload came after it
            row = (await index(s))["m"]
            assert row["state"] == "UNAVAILABLE" and row["reason"] == "unloaded"
    asyncio.run(go())
    assert wait_for(lambda: not runner_pids(daemon.root), 10)
    assert names_and_pins(daemon.root)[1] == {}


@pytest.mark.parametrize(("config", "fragment"), [
    ('{"instance_group": [{"count": 0}]}', "instance_group[0].count"),
    ('{"instance_group": [{"kind": "KIND_GPU"}]}', "runners.devices has no GPU"),
    ("[1]", "must be a JSON object"),
])
def test_a_bad_load_config_changes_nothing(daemon: DaemonProcess, tmp_path: Path, config: str,
                                           fragment: str) -> None:
    src = echo_carton(tmp_path / "m", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            status, body = await load(s, "m", src, config=config)
            assert status == 400 and fragment in body["error"], body
    asyncio.run(go())
    assert names_and_pins(daemon.root) == ({}, {})  # not fetched under the name, not pinned
    assert not runner_pids(daemon.root)


def test_metrics_while_models_come_and_go(daemon: DaemonProcess, tmp_path: Path) -> None:
    src = echo_carton(tmp_path / "m", **SMALL)

    async def go() -> None:
        async with unix_session(daemon.socket_path) as s:
            done = asyncio.Event()
            statuses: list[int] = []

            async def scrape() -> None:
                while not done.is_set():
                    statuses.append((await s.get("/metrics")).status)

            scraper = asyncio.ensure_future(scrape())
            for _ in range(3):
                assert (await load(s, "m", src))[0] == 200
                assert (await s.post("/v2/repository/models/m/unload", json={})).status == 200
            done.set()
            await scraper
            assert statuses and set(statuses) == {200}
    asyncio.run(go())


@pytest.mark.parametrize(("arg", "fragment"), [
    ("x_float32=[[1, 2", "is neither a .npy file nor JSON"),
    ("x_float32=[\"a\"]", "is not FP32 data"),
    ("x_float32=missing.npy", "cannot read missing.npy"),
    ("x_float32", "expected NAME=FILE.npy or NAME=JSON"),
])
def test_infer_cli_names_a_bad_input(daemon: DaemonProcess, tmp_path: Path, capsys, arg: str,
                                     fragment: str) -> None:
    from cartonstore.cli.commands import main

    src = echo_carton(tmp_path / "m", **SMALL)
    root = str(daemon.root)
    assert main(["add", str(src), "--name", "cli", "--root", root, "--progress", "none"]) == 0
    capsys.readouterr()
    assert main(["infer", "cli", "--input", arg, "--root", root]) == 4
    assert fragment in capsys.readouterr().err


def test_a_failed_load_leaves_a_name_someone_else_moved_meanwhile(daemon: DaemonProcess, tmp_path: Path) -> None:
    """The load points the name at its carton, then its runner fails; if
    another process moved the name in between, that move stands."""
    import subprocess
    import sys

    slow_bad = echo_carton(tmp_path / "bad", label="bad", startup="import time; time.sleep(2); raise SystemExit('no')",
                           **SMALL)
    other = echo_carton(tmp_path / "other", label="other", **SMALL)

    async def go() -> tuple[int, str]:
        async with unix_session(daemon.socket_path) as s:
            loading = asyncio.ensure_future(load(s, "m", slow_bad))
            assert await asyncio.to_thread(wait_for, lambda: "m" in names_and_pins(daemon.root)[0], 20)
            argv = [sys.executable, "-m", "cartonstore.cli", "add", str(other), "--name", "m", "--force",
                    "--root", str(daemon.root), "--progress", "none"]
            cp = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True)
            assert cp.returncode == 0, cp.stderr
            status, _ = await loading
            return status, cp.stdout.strip().splitlines()[-1]

    status, other_digest = asyncio.run(go())
    assert status == 400
    assert names_and_pins(daemon.root)[0]["m"] == other_digest
