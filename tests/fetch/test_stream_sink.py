"""StreamSink: one worker thread per stream, fed by the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import pytest
from kit.daemonkit import wait_for

from cartonstore.fetch.http.sink import StreamSink, in_own_thread


def test_chunks_are_worked_in_order_in_one_other_thread() -> None:
    done: list[bytes] = []
    threads: set[int] = set()

    def work(chunk: bytes) -> None:
        threads.add(threading.get_ident())
        done.append(chunk)

    async def main() -> None:
        sink = StreamSink(work, window=64)
        for i in range(500):
            await sink.put(str(i).encode())
        await sink.close()

    asyncio.run(main())
    assert done == [str(i).encode() for i in range(500)]
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_the_window_bounds_what_is_queued() -> None:
    """A slow worker makes put() wait: never more than the window plus one
    chunk is held."""
    held: list[int] = []
    pending = [0]
    lock = threading.Lock()

    def work(chunk: bytes) -> None:
        time.sleep(0.002)
        with lock:
            pending[0] -= len(chunk)

    async def main() -> None:
        sink = StreamSink(work, window=10_000)
        for _ in range(100):
            with lock:
                pending[0] += 1000
                held.append(pending[0])
            await sink.put(b"x" * 1000)
        await sink.close()

    asyncio.run(main())
    assert max(held) <= 11_000
    assert pending[0] == 0


def test_an_error_in_the_work_stops_the_stream_and_reaches_the_loop() -> None:
    worked: list[int] = []

    def work(chunk: bytes) -> None:
        if chunk == b"3":
            raise OSError("disk on fire")
        worked.append(int(chunk))

    async def main() -> None:
        sink = StreamSink(work, window=1)   # every put waits: the error shows at the next one
        with pytest.raises(OSError, match="disk on fire"):
            for i in range(10):
                await sink.put(str(i).encode())
        with pytest.raises(OSError, match="disk on fire"):
            await sink.close()

    asyncio.run(main())
    assert worked == [0, 1, 2]


def test_abort_drops_the_queue_and_waits_for_the_chunk_in_hand() -> None:
    started = threading.Event()
    finished: list[bytes] = []

    def work(chunk: bytes) -> None:
        started.set()
        time.sleep(0.05)
        finished.append(chunk)

    async def main() -> None:
        sink = StreamSink(work, window=1 << 20)
        for i in range(20):
            await sink.put(bytes([i]))
        await asyncio.to_thread(started.wait)
        await sink.abort()
        count = len(finished)
        await asyncio.sleep(0.1)   # two chunks' worth of work: what would run after abort has the time to
        assert len(finished) == count  # nothing ran after abort returned
        await sink.abort()              # twice is fine

    asyncio.run(main())
    assert 1 <= len(finished) < 20


def test_a_closed_sink_leaves_no_thread() -> None:
    before = {t.ident for t in threading.enumerate()}

    async def main() -> None:
        sink = StreamSink(lambda _c: None)
        await sink.put(b"x")
        await sink.close()
        await sink.abort()

    asyncio.run(main())
    assert wait_for(lambda: {t.ident for t in threading.enumerate() if t.name.startswith("cartonstore-")} <= before)



@contextlib.contextmanager
def threads_linger_after(function_name: str, seconds: float = 0.3) -> Iterator[None]:
    """New threads pause for ``seconds`` as ``function_name`` returns in
    them: after the job handed its result to the loop, before the thread
    ends (threading.setprofile sees the return)."""
    def profile(frame, event, arg) -> None:
        if event == "return" and frame.f_code.co_name == function_name:
            time.sleep(seconds)
    threading.setprofile(profile)
    try:
        yield
    finally:
        threading.setprofile(None)


def test_a_thread_job_is_done_only_once_its_thread_has_ended() -> None:
    """in_own_thread's future (what a direct read or a hasher awaits) is
    settled once the thread has ended, not when it hands its result over:
    a cancelled pull must leave no thread behind when the cancel returns."""
    async def run() -> tuple[int, list[str]]:
        result = await in_own_thread(lambda: 7, name="probe-job")
        return result, [t.name for t in threading.enumerate() if t.name == "cartonstore-probe-job"]

    with threads_linger_after("run"):
        assert asyncio.run(run()) == (7, [])


def test_a_sink_is_closed_only_once_its_thread_has_ended() -> None:
    async def run() -> list[str]:
        async with StreamSink(lambda chunk: None, name="probe-sink") as sink:
            await sink.put(b"x")
        return [t.name for t in threading.enumerate() if t.name == "cartonstore-probe-sink"]

    with threads_linger_after("_run"):
        assert asyncio.run(run()) == []
