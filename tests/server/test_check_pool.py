"""Check workers: real processes that parse and check big JSON infer
requests for the daemon (server/checks/pool.py, server/checks/worker.py).
The pool alone, then through real daemons: what they answer, what reaches
the runner, and that no worker outlives its daemon, even one SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import short_dir
from kit.daemonkit import DaemonProcess, wait_for, wait_for_async
from kit.inferkit import echo_carton, runner_pids
from kit.peerkit import metric
from kit.prockit import live_pids, wait_gone
from test_infer_api import _load, raw_post, runner_count

from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import TensorSpec
from cartonstore.server.checks.pool import START_FAILURES, CheckPool
from cartonstore.v2.framing import parse_infer_request, parse_infer_response, tensor_to_numpy

WORKER = "cartonstore.server.checks.worker"
SPECS = [TensorSpec("x", "float32", ["n"])]


def worker_pids(parent: int) -> list[int]:
    """Live check workers whose parent is ``parent``."""
    return live_pids(WORKER, parent=parent)


def big_json(count: int = 100_000) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [count],
                                   "data": (np.arange(count) * 0.5).tolist()}]}).encode()


def run(coro) -> Any:
    return asyncio.run(coro)


@asynccontextmanager
async def pool_of(size: int, **settings: object) -> AsyncIterator[CheckPool]:
    """A pool of its own; no worker of this process is left after it."""
    pool = CheckPool(size, **settings)
    try:
        yield pool
    finally:
        await pool.close()
    assert worker_pids(os.getpid()) == []


async def its_one_worker(pool: CheckPool) -> int:
    """The pid of the worker a first check starts."""
    assert await pool.check(SPECS, None, big_json()) is not None
    (pid,) = worker_pids(os.getpid())
    return pid


# -- the pool alone ---------------------------------------------------------------------------


def test_a_worker_answers_the_binary_form_and_is_reused() -> None:
    async def go() -> None:
        async with pool_of(2) as pool:
            for _ in range(3):
                parts, length = await pool.check(SPECS, None, big_json())
                body = b"".join(bytes(p) for p in parts)
                x = tensor_to_numpy(parse_infer_request(body, length).inputs[0])
                assert np.array_equal(x, np.arange(100_000, dtype=np.float32) * 0.5)
            assert pool.checked == 3 and len(worker_pids(os.getpid())) == 1   # one at a time: one worker
    run(go())


@pytest.mark.parametrize("body,problem", [
    (big_json().replace(b'"shape": [100000]', b'"shape": [99999]'), "needs 99999 elements"),
    (big_json()[:-3] + b', "datatype": "INT8"}]}', "appears twice"),
    (big_json().replace(b"0.5,", b'"0.5",', 1), "element 1 is a string"),
    (big_json()[:-10], "JSON is not valid"),
])
def test_a_bad_request_is_a_400_from_the_worker(body: bytes, problem: str) -> None:
    async def go() -> None:
        async with pool_of(1) as pool:
            with pytest.raises(InvalidInput, match=problem):
                await pool.check(SPECS, None, body)
            assert pool.checked == 1 and pool.failed == 0
    run(go())


def test_a_request_naming_shared_memory_is_left_to_the_daemon() -> None:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 16}}], "pad": "p" * 300_000}).encode()

    async def go() -> None:
        async with pool_of(1) as pool:
            assert await pool.check(SPECS, None, body) is None
    run(go())


def test_a_worker_killed_while_idle_is_replaced() -> None:
    async def go() -> None:
        async with pool_of(1) as pool:
            pid = await its_one_worker(pool)
            os.kill(pid, signal.SIGKILL)
            assert wait_gone(pid)
            assert await pool.check(SPECS, None, big_json()) is None   # the daemon checks it itself
            assert pool.failed == 1
            assert await pool.check(SPECS, None, big_json()) is not None   # a new worker
            assert len(worker_pids(os.getpid())) == 1
    run(go())


# A stand-in for the first worker: it takes the task whole, says so (the
# file named by argv[1]) and never answers; later workers are real ones.
SILENT_FIRST = r'''
import os, runpy, struct, sys
if os.path.exists(sys.argv[1]):
    runpy.run_module("cartonstore.server.checks.worker", run_name="__main__")
    sys.exit()
meta_size, body_size = struct.unpack("<IQ", sys.stdin.buffer.read(12))
sys.stdin.buffer.read(meta_size + body_size)
open(sys.argv[1], "w").close()
sys.stdin.buffer.read()
'''


@asynccontextmanager
async def check_under_way(tmp: Path) -> AsyncIterator[tuple[CheckPool, int, asyncio.Task]]:
    """A pool of one whose worker has taken a check whole and is on it (for
    ever): the pool, the worker's pid and the check's task. No sleep decides
    when the check is under way, so a fast machine cannot finish it first."""
    script, told = tmp / f"{WORKER}-silent-first.py", tmp / "told"   # named so worker_pids finds it
    script.write_text(SILENT_FIRST)
    async with pool_of(1, command=(sys.executable, str(script), str(told))) as pool:
        task = asyncio.create_task(pool.check(SPECS, None, big_json()))
        assert await wait_for_async(told.exists)
        (pid,) = worker_pids(os.getpid())
        yield pool, pid, task


def test_a_task_cancelled_mid_way_kills_its_worker(short_tmp: Path) -> None:
    async def go() -> None:
        async with check_under_way(short_tmp) as (pool, pid, task):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert wait_gone(pid)
            assert await pool.check(SPECS, None, big_json()) is not None
    run(go())


# -- through the daemon -----------------------------------------------------------------------


@contextmanager
def echo_served_with(server_toml: str, stop: int = signal.SIGTERM) -> Iterator[tuple[DaemonProcess, list[int]]]:
    """A daemon of its own serving echo, stopped with ``stop``; after it,
    none of its runners and none of the workers the test listed is left."""
    with short_dir() as base:
        config = base / "cartonstore.toml"
        config.write_text(f"[server]\n{server_toml}\n")
        d = DaemonProcess(base / "root", extra_args=["--config", str(config)]).start()
        workers: list[int] = []
        try:
            _load(d, "echo", echo_carton(base / "echo", dtypes=["float32"]))
            yield d, workers
        finally:
            d.stop(stop)
        assert all(wait_gone(pid, 5) for pid in workers)
        assert wait_for(lambda: not runner_pids(d.root), 10)


def _infer(d: DaemonProcess, body: bytes) -> tuple[int, dict]:
    status, _headers, answer = raw_post(d, "/v2/models/echo/infer", body, {})
    return status, (parse_infer_response(answer, None)[1] if status == 200 else json.loads(answer))


def big_json_echo() -> bytes:
    return json.dumps({"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 100_000],
                                   "data": [0.5] * 100_000}]}).encode()


@pytest.mark.slow
def test_the_daemon_checks_big_json_in_a_worker_and_stops_it_with_itself() -> None:
    x = (np.arange(100_000) % 977 * 0.25).astype(np.float32).reshape(1, -1)
    body = json.dumps({"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 100_000],
                                   "data": x.tolist()}]}).encode()
    with echo_served_with("check_workers = 2") as (d, workers):
        assert metric(d, "cartonstore_check_workers") == 0   # none until one is needed
        status, arrays = _infer(d, body)
        assert status == 200 and np.array_equal(arrays["y_float32"], x)
        assert metric(d, "cartonstore_check_worker_requests_total") == 1
        small = json.dumps({"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 2],
                                        "data": [1, 2]}]}).encode()
        assert _infer(d, small)[0] == 200
        assert metric(d, "cartonstore_check_worker_requests_total") == 1   # small: checked on the loop
        seen = runner_count(d, "echo")
        status, doc = _infer(d, body.replace(b'"datatype": "FP32"', b'"datatype": "FP16"'))
        assert status == 400 and "input 'x_float32'" in doc["error"] and "FP16" in doc["error"]
        assert runner_count(d, "echo") == seen
        workers += worker_pids(d.proc.pid)
        assert len(workers) == 1 and metric(d, "cartonstore_check_workers") == 1


@pytest.mark.slow
def test_a_sigkilled_daemon_leaves_no_worker() -> None:
    with echo_served_with("check_workers = 1", signal.SIGKILL) as (d, workers):
        assert _infer(d, big_json_echo())[0] == 200
        workers += worker_pids(d.proc.pid)
        assert len(workers) == 1


@pytest.mark.slow
def test_without_workers_big_json_is_checked_in_the_daemon() -> None:
    with echo_served_with("check_workers = 0") as (d, _):
        assert _infer(d, big_json_echo())[0] == 200
        assert worker_pids(d.proc.pid) == []


def test_an_idle_worker_is_stopped_and_a_new_one_started_when_needed() -> None:
    async def go() -> None:
        # idle_stop long enough that, on a loaded machine, the worker done first is still there when
        # the other is: both are counted before either may stop
        async with pool_of(2, idle_stop=2.0) as pool:
            await asyncio.gather(*(pool.check(SPECS, None, big_json(300_000)) for _ in range(2)))
            first = worker_pids(os.getpid())
            assert len(first) == 2
            # idle for idle_stop: stopped, and their processes gone (on the loop: it reaps them)
            assert await wait_for_async(lambda: pool.stats()["workers"] == 0
                                        and not set(first) & set(worker_pids(os.getpid())))
            assert await pool.check(SPECS, None, big_json()) is not None
            assert len(worker_pids(os.getpid())) == 1 and pool.failed == 0
    run(go())


# A stand-in worker: whatever the task, a "forward" answer of 8 MB, at once.
BIG_ANSWER = r'''
import pickle, struct, sys
head = sys.stdin.buffer.read(12)
meta_size, body_size = struct.unpack("<IQ", head)
sys.stdin.buffer.read(meta_size + body_size)
meta = pickle.dumps(("forward", 10, [10, 8_000_000]))
sys.stdout.buffer.write(struct.pack("<I", len(meta)) + meta + bytes(8_000_010))
sys.stdout.buffer.flush()
sys.stdin.buffer.read()
'''


def test_a_task_cancelled_while_reading_its_answer_is_paused_lets_close_end(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The cancel lands in the loop iteration where reading the worker's
    # answer paused (its buffer full): asyncio's Process.wait() would then
    # wait for end of file on a pipe nobody reads, and close() for ever.
    script = short_tmp / "big_answer.py"
    script.write_text(BIG_ANSWER)
    cancelled: list[asyncio.Task] = []
    feed = asyncio.StreamReader.feed_data

    def feed_then_cancel(reader: asyncio.StreamReader, data: bytes) -> None:
        feed(reader, data)
        if reader._paused and cancelled and not cancelled[0].done():  # the moment to hit
            cancelled[0].cancel()
    monkeypatch.setattr(asyncio.StreamReader, "feed_data", feed_then_cancel)

    async def go() -> None:
        async with pool_of(1, command=(sys.executable, str(script))) as pool:
            task = asyncio.create_task(pool.check(SPECS, None, big_json()))
            cancelled.append(task)
            assert (await asyncio.gather(task, return_exceptions=True))[0].__class__ is asyncio.CancelledError
            await asyncio.wait_for(pool.close(), 10)
    run(go())


def test_workers_that_cannot_start_are_not_tried_for_a_while() -> None:
    async def go() -> None:
        async with pool_of(1, command=(sys.executable, "-c", "import sys; sys.exit(3)")) as pool:
            for _ in range(START_FAILURES):
                assert await pool.check(SPECS, None, big_json()) is None
            assert pool.failed == START_FAILURES
            assert await pool.check(SPECS, None, big_json()) is None
            assert pool.failed == START_FAILURES   # resting: no fourth process was started
    run(go())


def test_a_fault_in_the_worker_is_said_and_the_worker_lives_on() -> None:
    async def go() -> None:
        async with pool_of(1) as pool:
            assert await pool.check("not a list of specs", None, big_json()) is None   # type: ignore[arg-type]  # a wrong type on purpose
            (pid,) = worker_pids(os.getpid())
            assert await pool.check(SPECS, None, big_json()) is not None
            assert worker_pids(os.getpid()) == [pid] and pool.failed == 0
    run(go())


def test_more_checks_than_workers_wait_for_one() -> None:
    async def go() -> None:
        async with pool_of(2) as pool:
            answers = await asyncio.gather(*(pool.check(SPECS, None, big_json(200_000)) for _ in range(5)))
            assert all(a is not None for a in answers) and pool.checked == 5
            assert len(worker_pids(os.getpid())) == 2 and pool.stats()["workers"] == 2
    run(go())


def test_closing_while_a_check_runs_leaves_it_to_the_daemon(short_tmp: Path) -> None:
    async def go() -> None:
        async with check_under_way(short_tmp) as (pool, pid, task):
            await asyncio.wait_for(pool.close(), 10)
            assert await task is None            # the caller checks it itself
            assert wait_gone(pid) and pool.failed == 0   # not a worker's failure: the pool closed
            assert await pool.check(SPECS, None, big_json()) is None   # closed: no new worker
    run(go())


def test_closing_while_a_worker_starts_reaps_it_before_close_returns() -> None:
    """close() used to reap only the workers it knew: one still starting
    was added after close() had returned, and left running."""
    async def go() -> None:
        before = set(worker_pids(os.getpid()))   # an earlier test's worker, still being reaped, is not this one
        pool = CheckPool(1)
        task = asyncio.create_task(pool.check(SPECS, None, big_json()))
        try:
            await asyncio.sleep(0)   # the check runs until its worker's start awaits
            started = set(worker_pids(os.getpid())) - before
            assert len(started) == 1 and pool.stats()["workers"] == 0   # started, not yet the pool's
            await asyncio.wait_for(pool.close(), 10)
            assert not set(worker_pids(os.getpid())) & started
            assert await task is None and pool.failed == 0
        finally:
            # Python 3.11: a spawn that asyncio.run cancels at its end, its pipes not yet connected,
            # waits forever for its exit (its internal pipe task is cancelled too): a failed
            # assertion above would hang the run instead of failing it
            await asyncio.wait_for(pool.close(), 10)
            await asyncio.wait([task], timeout=10)
    run(go())


def test_closing_twice_and_checking_after_close_end_at_once() -> None:
    async def go() -> None:
        async with pool_of(2) as pool:
            await its_one_worker(pool)
            await asyncio.wait_for(asyncio.gather(pool.close(), pool.close()), 10)
            assert await asyncio.wait_for(pool.check(SPECS, None, big_json()), 5) is None
    run(go())


@pytest.mark.slow
def test_a_big_json_request_writing_to_shared_memory_is_told_apart_by_the_worker() -> None:
    """A big all-JSON body goes to a worker without being scanned on the
    loop for a region's name; the worker says it names shared memory, and
    the daemon, which holds the regions, finishes it."""
    x = (np.arange(100_000) % 977 * 0.25).astype(np.float32).reshape(1, -1)
    key = f"/cs-test-{os.getpid()}-bigjson"
    path = Path("/dev/shm" + key)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, x.nbytes)
        with echo_served_with("check_workers = 1") as (d, workers):
            region = json.dumps({"key": key, "byte_size": x.nbytes}).encode()
            assert raw_post(d, "/v2/systemsharedmemory/region/out/register", region, {})[0] == 200
            body = json.dumps({"inputs": [{"name": "x_float32", "datatype": "FP32", "shape": [1, 100_000],
                                           "data": x.tolist()}],
                               "outputs": [{"name": "y_float32", "parameters": {
                                   "shared_memory_region": "out", "shared_memory_byte_size": x.nbytes}}]}).encode()
            status, _headers, answer = raw_post(d, "/v2/models/echo/infer", body, {})
            assert status == 200, answer
            assert np.array_equal(np.frombuffer(os.pread(fd, x.nbytes, 0), np.float32).reshape(1, -1), x)
            assert metric(d, "cartonstore_check_worker_requests_total") == 1
            workers += worker_pids(d.proc.pid)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
