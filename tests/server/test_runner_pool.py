"""The daemon's runner supervisor (cartonstore.server.runner_processes) against real
runner processes: tiny aiohttp servers on Unix sockets that these tests
write themselves, each able to misbehave on demand (crash, hang, answer
garbage, fail to start, never get ready). Every test checks that no process
running its runner script is left behind."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.daemonkit import wait_for_async
from kit.prockit import live_pids, script_leaving_no_process, wait_gone

from cartonstore.config.runners import RunnerSettings
from cartonstore.errors import BadUpstream, CartonStoreError, InvalidInput, Unavailable
from cartonstore.server.runner_processes import (
    InstanceSpec,
    ModelRunners,
    RunnersBusy,
    clean_stale_sockets,
    daemon_run_dir,
    ensure_run_dir,
    fill_argv,
    instance_socket_path,
    template_placeholders,
)
from cartonstore.store.root.owner import owner_token

PY = sys.executable
INFER = "/v2/models/m/infer"

# The runner. Its behaviour at start comes from argv (--start exit|never|die-after:S, --fork-helper); per
# request from the body: "sleep:S", "crash", "hang", "garbage", "close", anything else is echoed.
RUNNER = r'''
import asyncio, hashlib, json, os, sys, time
from aiohttp import web

args = sys.argv[1:]
opt = lambda name, default=None: args[args.index(name) + 1] if name in args else default
sock, start = opt("--socket"), opt("--start", "ok")
if start == "exit":
    print("loading model...", file=sys.stderr)
    print("fatal: no weights here", file=sys.stderr, flush=True)
    sys.exit(3)
if start == "flood":   # 50,000 lines, then its last words
    sys.stderr.write("noise\n" * 50000 + "fatal: the last words\n")
    sys.stderr.flush()
    sys.exit(3)
if "--fork-helper" in args and os.fork() == 0:
    time.sleep(120)  # a helper process that must die with its runner's group
    os._exit(0)

async def ready(request):
    return web.Response(status=503 if start == "never" else 200)

async def infer(request):
    body = await request.read()
    if body.startswith(b"sleep:"):
        await asyncio.sleep(float(body[6:]))
    elif body == b"crash":
        print("crashing on purpose", file=sys.stderr, flush=True)
        os._exit(1)
    elif body == b"hang":
        await asyncio.sleep(3600)
    elif body.startswith(b"big:"):
        return web.Response(body=b"z" * int(body[4:]), content_type="application/octet-stream")
    elif body == b"chunked":
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for piece in (b"one,", b"two,", b"three"):
            await resp.write(piece)
        await resp.write_eof()
        return resp
    elif body in (b"garbage", b"close"):
        request.transport.write(b"\x00\xffNOT HTTP AT ALL\r\n\r\n" if body == b"garbage" else b"")
        request.transport.close()
        await asyncio.sleep(0.5)
        return web.Response()
    answer = {"pid": os.getpid(), "size": len(body), "sha": hashlib.sha256(body).hexdigest(),
              "header_length": request.headers.get("Inference-Header-Content-Length"),
              "content_type": request.headers.get("Content-Type"),
              "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "extra": os.environ.get("RUNNER_TEST_EXTRA")}
    return web.Response(body=json.dumps(answer).encode(), content_type="application/json",
                        headers={"Inference-Header-Content-Length": "7", "X-Not-Forwarded": "1"})

async def main():
    app = web.Application(client_max_size=1 << 30)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_post("/v2/models/m/infer", infer)
    runner = web.AppRunner(app, handle_signals=True)
    await runner.setup()
    await web.UnixSite(runner, sock).start()
    if start.startswith("die-after:"):
        await asyncio.sleep(float(start.split(":")[1]))
        print("dying on schedule", file=sys.stderr, flush=True)
        os._exit(7)
    await asyncio.Event().wait()

asyncio.run(main())
'''

# A daemon stand-in: owns a pool, says READY with its runner's pid, waits to be killed.
PARENT = r'''
import asyncio, sys
from pathlib import Path
from cartonstore.config.runners import RunnerSettings
from cartonstore.server.runner_processes import InstanceSpec, ModelRunners

async def main():
    script, sock = sys.argv[1], sys.argv[2]
    runners = ModelRunners("m", "1", [InstanceSpec([sys.executable, script, "--socket", sock], {}, Path(sock), "cpu")],
                           RunnerSettings(ready_timeout=20))
    await runners.start()
    print("READY", runners.status()["instances"][0]["pid"], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
'''

@pytest.fixture
def script(short_tmp: Path) -> Iterator[Path]:
    """The fake runner, written for this test; no process running it may be left after."""
    with script_leaving_no_process(short_tmp / "fake_runner.py", RUNNER) as path:
        yield path


FAST = {"ready_timeout": 20.0, "request_timeout": 10.0, "stop_grace": 5.0, "restart_backoff": 0.05, "max_restarts": 3}


def spec(script: Path, short_tmp: Path, i: int = 0, *extra: str, device: str = "cpu",
         env: dict[str, str] | None = None) -> InstanceSpec:
    sock = short_tmp / f"r{i}.sock"
    return InstanceSpec([PY, str(script), "--socket", str(sock), *extra], env or {}, sock, device)


def run(coro: Any, timeout: float = 40.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def infer(runners: ModelRunners, body: bytes | list[bytes] = b"hi", **headers: str) -> dict:
    resp = await runners.forward(INFER, body, headers)
    assert resp.status == 200, resp
    return json.loads(resp.body)


# -- normal life ------------------------------------------------------------------


def test_start_forward_stop(script: Path, short_tmp: Path) -> None:
    changes: list[str] = []

    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp, env={"RUNNER_TEST_EXTRA": "x1"}, device="cuda:3")],
                               RunnerSettings(**FAST), on_change=lambda: changes.append(runners.state))
        assert runners.state == "LOADING"
        await runners.start()
        try:
            assert runners.state == "READY" and runners.reason == "" and runners.restarts == 0
            status = runners.status()
            assert status["instances"][0]["state"] == "READY" and status["instances"][0]["pid"]
            resp = await runners.forward(INFER, [b'{"x":1}', b"\x01\x02\x03"],
                                         {"Inference-Header-Content-Length": "7", "Content-Type": "application/json",
                                          "Host": "ignored", "Content-Length": "999"})
            assert resp.status == 200
            assert resp.headers == {"Content-Type": "application/json",
                                    "Inference-Header-Content-Length": "7"}
            answer = json.loads(resp.body)
            assert answer["size"] == 10 and answer["header_length"] == "7"
            assert answer["content_type"] == "application/json"
            assert answer["cuda"] == "3" and answer["extra"] == "x1"
            assert answer["pid"] == status["instances"][0]["pid"]
            # big bodies both ways, byte for byte; a chunked answer
            parts = [os.urandom(3_000_000), memoryview(os.urandom(700_000)), b"", os.urandom(3)]
            answer = await infer(runners, parts)
            assert answer["size"] == 3_700_003 and answer["sha"] == hashlib.sha256(b"".join(parts)).hexdigest()
            big = await runners.forward(INFER, b"big:5000000", {})
            assert big.status == 200 and big.body == b"z" * 5_000_000
            assert (await runners.forward(INFER, b"chunked", {})).body == b"one,two,three"
            assert runners.outstanding == 0
        finally:
            await runners.stop()
        assert runners.state == "UNAVAILABLE" and runners.reason == "unloaded"
        assert not (short_tmp / "r0.sock").exists()
        with pytest.raises(Unavailable, match="being unloaded"):
            await runners.forward(INFER, b"x", {})
        await runners.stop()  # twice is fine

    run(go())
    assert "READY" in changes and changes[-1] == "UNAVAILABLE"


def test_a_gpu_is_named_as_the_daemons_own_cuda_visible_devices_names_it(script: Path, short_tmp: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon given GPUs 5 and 7 places cuda:1 on GPU 7; cuda:2 it was not given."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")

    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp, device="cuda:1")], RunnerSettings(**FAST))
        await runners.start()
        try:
            assert (await infer(runners))["cuda"] == "7"
        finally:
            await runners.stop()
        beyond = ModelRunners("m", "1", [spec(script, short_tmp, device="cuda:2")], RunnerSettings(**FAST))
        with pytest.raises(CartonStoreError) as raised:
            await beyond.start()
        assert "cuda:2 is not a GPU this daemon was given: CUDA_VISIBLE_DEVICES is '5,7' (cuda:0 is GPU 5, " \
               "cuda:1 is GPU 7)" in str(raised.value)
        await beyond.stop()

    run(go())


def test_physical_gpu_follows_the_inherited_list() -> None:
    from cartonstore.server.runner_processes.settings import physical_gpu

    assert physical_gpu("cuda:3", None) == "3"
    assert physical_gpu("cuda:0", "2,3") == "2" and physical_gpu("cuda:1", " 2 , 3 ") == "3"
    assert physical_gpu("cuda:0", "GPU-5a1b") == "GPU-5a1b"
    for inherited, words in (("", "no GPU"), ("2", "cuda:0 is GPU 2")):
        with pytest.raises(InvalidInput, match=words):
            physical_gpu("cuda:1", inherited)


def test_cpu_instance_sees_no_gpu(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp)], RunnerSettings(**FAST))
        await runners.start()
        try:
            assert (await infer(runners))["cuda"] == ""
        finally:
            await runners.stop()

    run(go())


# -- failures at start ----------------------------------------------------------


def test_a_runner_flooding_stderr_is_logged_at_a_rate_and_its_last_words_kept(script: Path, short_tmp: Path,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp, 0, "--start", "flood")], RunnerSettings(**FAST))
        with pytest.raises(InvalidInput) as e:
            await runners.start()
        assert str(e.value).endswith("  noise\n  fatal: the last words"), str(e.value)[-300:]
        assert e.value.details["stderr"][-1] == "fatal: the last words" and len(e.value.details["stderr"]) == 20

    with caplog.at_level(logging.INFO, logger="cartonstore.server.runner_processes"):
        run(go())
    logged = [r for r in caplog.records if r.getMessage().startswith("[m#0] noise")]
    assert 100 <= len(logged) <= 210, len(logged)   # 200 at once (and 20 a second), of 50,000
    assert any("output lines not logged" in r.getMessage() for r in caplog.records)



def test_runner_that_exits_at_start(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp, 0, "--start", "exit")], RunnerSettings(**FAST))
        with pytest.raises(InvalidInput) as e:
            await runners.start()
        assert str(e.value) == ("runner for m failed to start: exited with status 3; its last stderr lines:\n"
                                "  loading model...\n  fatal: no weights here")
        assert e.value.details == {"stderr": ["loading model...", "fatal: no weights here"]}
        assert runners.state == "UNAVAILABLE"

    run(go())


def test_runner_that_never_gets_ready(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        specs = [spec(script, short_tmp, 0), spec(script, short_tmp, 1, "--start", "never", "--fork-helper")]
        runners = ModelRunners("m", "1", specs, RunnerSettings(**{**FAST, "ready_timeout": 1.5}))
        started = time.monotonic()
        with pytest.raises(InvalidInput, match=r"^runner for m \(instance 1\) failed to start: not ready after 1.5s$"):
            await runners.start()
        assert time.monotonic() - started < 5
        assert not (short_tmp / "r0.sock").exists()  # the healthy one was stopped too

    run(go())


def test_command_that_cannot_run(short_tmp: Path) -> None:
    async def go() -> None:
        sock = short_tmp / "r.sock"
        runners = ModelRunners("m", "1", [InstanceSpec([str(short_tmp / "no-such-runner")], {}, sock, "cpu")],
                               RunnerSettings(**FAST))
        with pytest.raises(InvalidInput, match="runner for m failed to start: cannot run .*no-such-runner"):
            await runners.start()

    run(go())


# -- failures in life -----------------------------------------------------------


def test_crash_on_request_fails_it_and_restarts(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        changes = []
        # the helper keeps stderr open after the runner dies: that must not hide how it died
        runners = ModelRunners("m", "1", [spec(script, short_tmp, 0, "--fork-helper")], RunnerSettings(**FAST),
                               on_change=lambda: changes.append(runners.state))
        await runners.start()
        try:
            first = (await infer(runners))["pid"]
            with pytest.raises(Unavailable, match=r"^runner for m \(instance 0\) died with the request in it "
                                                  r"\(it may have run\): exited with status 1; "
                                                  r"its last stderr lines:\n  crashing on purpose$"):
                await runners.forward(INFER, b"crash", {})
            assert await wait_for_async(lambda: runners.restarts == 1 and runners.state == "READY")
            assert (await infer(runners))["pid"] != first
            assert "LOADING" in changes
        finally:
            await runners.stop()

    run(go())


def test_killed_runner_is_restarted_and_restart_wait_0_refuses_at_once(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp)], RunnerSettings(**FAST, restart_wait=0.0))
        await runners.start()
        try:
            first = runners.status()["instances"][0]["pid"]
            os.kill(first, signal.SIGKILL)
            assert await wait_for_async(lambda: runners.reason.startswith("restarting after"))
            assert runners.state == "LOADING" and "exited with signal 9 (SIGKILL)" in runners.reason
            with pytest.raises(Unavailable, match=r"^model m has no ready runner \(loading\) after waiting "
                                                  r"runners.restart_wait 0s: restarting after: exited with signal 9"):
                await runners.forward(INFER, b"x", {})
            assert await wait_for_async(lambda: runners.state == "READY")
            assert runners.restarts == 1 and (await infer(runners))["pid"] != first
        finally:
            await runners.stop()

    run(go())


def test_request_during_a_restart_waits_for_the_new_runner(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp)], RunnerSettings(**{**FAST, "restart_backoff": 0.5}))
        await runners.start()
        try:
            first = runners.status()["instances"][0]["pid"]
            os.kill(first, signal.SIGKILL)
            assert await wait_for_async(lambda: runners.reason.startswith("restarting after"))
            waiting = [asyncio.ensure_future(infer(runners)) for _ in range(3)]
            await asyncio.sleep(0.05)
            assert runners.outstanding == 3   # waiting requests count against max_inflight
            answers = await asyncio.gather(*waiting)
            assert {a["pid"] for a in answers} == {runners.status()["instances"][0]["pid"]} != {first}
        finally:
            await runners.stop()

    run(go())


def test_runner_not_back_within_restart_wait_is_refused_naming_it(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        settings = RunnerSettings(**{**FAST, "restart_backoff": 5.0, "restart_wait": 0.3})
        runners = ModelRunners("m", "1", [spec(script, short_tmp, 0, "--start", "die-after:0.2")], settings)
        await runners.start()
        try:
            assert await wait_for_async(lambda: runners.reason.startswith("restarting after"))
            with pytest.raises(Unavailable, match=r"^model m has no ready runner \(loading\) after waiting "
                                                  r"runners.restart_wait 0.3s: restarting after: exited with "
                                                  r"status 7"):
                await runners.forward(INFER, b"x", {})
            assert runners.outstanding == 0
        finally:
            await runners.stop()

    run(go())


def test_runner_that_keeps_dying_becomes_unavailable(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        settings = RunnerSettings(**{**FAST, "max_restarts": 2, "restart_backoff": 0.01})
        runners = ModelRunners("m", "1", [spec(script, short_tmp, 0, "--start", "die-after:0.2")], settings)
        await runners.start()
        try:
            assert await wait_for_async(lambda: runners.state == "UNAVAILABLE", timeout=20)
            assert runners.restarts == 2
            assert runners.reason == ("failed 3 times in a row; last: exited with status 7; "
                                      "its last stderr lines:\n  dying on schedule")
            with pytest.raises(Unavailable, match="model m has no ready runner .unavailable.: failed 3 times"):
                await runners.forward(INFER, b"x", {})
        finally:
            await runners.stop()

    run(go())


def test_request_timeout_kills_and_restarts(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp, 0, "--fork-helper")],
                               RunnerSettings(**{**FAST, "request_timeout": 0.5}))
        await runners.start()
        try:
            first = runners.status()["instances"][0]["pid"]
            started = time.monotonic()
            with pytest.raises(Unavailable, match=r"^runner for m \(instance 0\) did not answer within 0.5s; "
                                                  r"restarting it$"):
                await runners.forward(INFER, b"hang", {})
            assert time.monotonic() - started < 2
            assert await wait_for_async(lambda: "killed after not answering a request within 0.5s" in runners.reason)
            assert await wait_for_async(lambda: runners.state == "READY")
            assert runners.restarts == 1
            assert wait_gone(first)
            assert (await infer(runners))["pid"] != first
        finally:
            await runners.stop()

    run(go())


@pytest.mark.parametrize("body, error, message", [
    (b"garbage", BadUpstream, r"^runner for m \(instance 0\) answered wrongly, .*: not an HTTP response"),
    (b"close", Unavailable, r"^runner for m \(instance 0\) broke the HTTP exchange")])
def test_garbage_answer_fails_request_but_keeps_runner(script: Path, short_tmp: Path, body: bytes,
                                                       error: type, message: str) -> None:
    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp)], RunnerSettings(**FAST))
        await runners.start()
        try:
            first = (await infer(runners))["pid"]
            with pytest.raises(error, match=message):
                await runners.forward(INFER, body, {})
            assert runners.state == "READY" and runners.restarts == 0
            assert (await infer(runners))["pid"] == first
        finally:
            await runners.stop()

    run(go())


# -- dispatch and limits ------------------------------------------------------------


def test_least_outstanding_dispatch(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp, 0), spec(script, short_tmp, 1)],
                               RunnerSettings(**FAST))
        await runners.start()
        try:
            pids = {inst["pid"] for inst in runners.status()["instances"]}
            assert len(pids) == 2
            slow = asyncio.ensure_future(infer(runners, b"sleep:1.0"))
            assert await wait_for_async(lambda: runners.outstanding == 1)
            busy = next(i["pid"] for i in runners.status()["instances"] if i["outstanding"] == 1)
            quick = [(await infer(runners))["pid"] for _ in range(5)]
            assert quick == [(pids - {busy}).pop()] * 5
            assert (await slow)["pid"] == busy
            both = await asyncio.gather(infer(runners, b"sleep:0.2"), infer(runners, b"sleep:0.2"))
            assert {a["pid"] for a in both} == pids
        finally:
            await runners.stop()

    run(go())


def test_max_inflight_answers_busy(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp)], RunnerSettings(**{**FAST, "max_inflight": 2}))
        await runners.start()
        try:
            slow = [asyncio.ensure_future(infer(runners, b"sleep:0.5")) for _ in range(2)]
            assert await wait_for_async(lambda: runners.outstanding == 2)
            with pytest.raises(RunnersBusy, match="model m already has 2 requests in flight") as e:
                await runners.forward(INFER, b"x", {})
            assert e.value.retry_after == 1 and isinstance(e.value, Unavailable)
            await asyncio.gather(*slow)
            await infer(runners)
        finally:
            await runners.stop()

    run(go())


def test_stop_lets_in_flight_request_finish(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp, 0, "--fork-helper")], RunnerSettings(**FAST))
        await runners.start()
        pending = asyncio.ensure_future(infer(runners, b"sleep:0.5"))
        assert await wait_for_async(lambda: runners.outstanding == 1)
        await runners.stop()
        assert pending.done() and (await pending)["size"] == 9

    run(go())


def test_stop_while_starting(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        runners = ModelRunners("m", "1", [spec(script, short_tmp)], RunnerSettings(**FAST))
        starting = asyncio.ensure_future(runners.start())
        assert await wait_for_async(lambda: any(runners.pids), interval=0.005)   # its process runs, not yet ready
        await runners.stop()
        with pytest.raises(Unavailable, match="unloaded while its runners started"):
            await starting

    run(go())


# -- the daemon dies --------------------------------------------------------------------


def test_sigkilled_owner_takes_its_runner_along(script: Path, short_tmp: Path) -> None:
    parent_script = short_tmp / "fake_daemon.py"
    parent_script.write_text(PARENT)
    parent = subprocess.Popen([PY, str(parent_script), str(script), str(short_tmp / "p.sock")],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = parent.stdout.readline().split()
        assert line[0] == "READY", line
        runner_pid = int(line[1])
        assert [p for p in live_pids(str(script)) if p != parent.pid] == [runner_pid]
        parent.kill()
        parent.wait()
        assert wait_gone(runner_pid, 5.0), "runner outlived its SIGKILLed owner"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()


# -- sockets and command templates ----------------------------------------------------------


def _bound(path: Path, *, listening: bool) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    if listening:
        sock.listen()
    return sock


def test_clean_stale_sockets_takes_only_what_gone_daemons_left(short_tmp: Path) -> None:
    """Each daemon's sockets are in a directory named by its owner token: a
    live daemon's (its owner lock held, here by this process) is left whole,
    even a socket nobody listens on; a gone one's sockets and directory are
    removed (anything else in it stays); loose sockets of no daemon go when
    nobody listens."""
    tmp_dir = short_tmp / "tmp"
    tmp_dir.mkdir()
    runners = ensure_run_dir(short_tmp / "run" / "runners")
    assert runners.stat().st_mode & 0o777 == 0o700
    live_dir = ensure_run_dir(daemon_run_dir(runners, owner_token(tmp_dir)))
    gone_dir = ensure_run_dir(daemon_run_dir(runners, "0123456789ab"))    # its owner lock is gone with it
    kept_dir = ensure_run_dir(daemon_run_dir(runners, "ba9876543210"))
    (kept_dir / "notes.txt").write_text("not ours to remove")
    socks = [_bound(live_dir / "a.g1-12345678-0.sock", listening=True),
             _bound(live_dir / "b.g2-12345678-0.sock", listening=False),
             _bound(gone_dir / "a.g1-12345678-0.sock", listening=False),
             _bound(kept_dir / "a.g1-12345678-0.sock", listening=False),
             _bound(runners / "old-12345678-0.sock", listening=False),
             _bound(runners / "live-12345678-0.sock", listening=True)]
    for sock in socks[2:5] + socks[1:2]:
        sock.close()  # the file stays, nobody listens: what a crash leaves
    (runners / "notes.sock").write_text("not a socket")
    try:
        assert clean_stale_sockets(runners, tmp_dir) == [gone_dir / "a.g1-12345678-0.sock",
                                                         kept_dir / "a.g1-12345678-0.sock",
                                                         runners / "old-12345678-0.sock"]
        assert sorted(p.name for p in runners.iterdir()) == sorted(
            ["live-12345678-0.sock", "notes.sock", live_dir.name, kept_dir.name])
        assert sorted(p.name for p in live_dir.iterdir()) == ["a.g1-12345678-0.sock", "b.g2-12345678-0.sock"]
        assert [p.name for p in kept_dir.iterdir()] == ["notes.txt"]
    finally:
        socks[0].close()
        socks[5].close()
    assert clean_stale_sockets(short_tmp / "missing", tmp_dir) == []


def test_instance_socket_path(short_tmp: Path) -> None:
    assert instance_socket_path(short_tmp, "resnet", "0123456789abcdef", 2) == short_tmp / "resnet-01234567-2.sock"
    assert instance_socket_path(short_tmp, "team/model x", "v1", 0).name == "team_model_x-v1-0.sock"
    long = instance_socket_path(short_tmp, "n" * 200, "0123456789", 0)
    assert len(os.fsencode(long)) <= 107 and long.name.endswith("-01234567-0.sock")
    assert long != instance_socket_path(short_tmp, "n" * 199 + "m", "0123456789", 0)
    with pytest.raises(InvalidInput, match="too long"):
        instance_socket_path(short_tmp / ("d" * 120), "m", "v", 0)


def test_fill_argv() -> None:
    template = ["{python}", "-m", "cartonstore.runner.backends.onnx", "--model-dir", "{model_dir}", "--socket={socket}",
                "--opts", "{opts}", "{{literal}}"]
    assert template_placeholders(template) == {"python", "model_dir", "socket", "opts"}
    assert fill_argv(template, python="/py", model_dir="/m {x}", socket="/s", opts='{"a": 1}', name="unused") == [
        "/py", "-m", "cartonstore.runner.backends.onnx", "--model-dir", "/m {x}", "--socket=/s", "--opts", '{"a": 1}',
        "{literal}"]
    with pytest.raises(InvalidInput, match=r"unknown placeholder \{model_path\}"):
        fill_argv(["run", "{model_path}"], model_dir="/m")
    with pytest.raises(InvalidInput, match=r"unmatched '\{'"):
        template_placeholders(["run", "{oops"])
    with pytest.raises(InvalidInput, match=r"uses \{devices\} but no value"):
        fill_argv(["run", "{devices}"])
    with pytest.raises(InvalidInput, match="non-empty list"):
        fill_argv([])
    with pytest.raises(InvalidInput, match=r"'\{name\}' would be '-x', which a runner would read as an option"):
        fill_argv(["run", "--name", "{name}"], name="-x")
    assert fill_argv(["run", "--name={name}"], name="-x") == ["run", "--name=-x"]   # not an option of its own


def test_spec_is_checked(short_tmp: Path) -> None:
    # [runners]' values are checked as the config is read (tests/config/test_config.py)
    with pytest.raises(InvalidInput, match="device 'gpu0'"):
        InstanceSpec(["x"], {}, short_tmp / "s", "gpu0")
    with pytest.raises(InvalidInput, match="share one socket"):
        ModelRunners("m", "1", [InstanceSpec(["x"], {}, short_tmp / "s", "cpu")] * 2, RunnerSettings())
