"""The tensor arena (cartonstore.server.tensors.arena) on its own: slots, seals,
pages given back; the request and answer forms (arena_wire.py); and the
runner supervisor handing the arena to real runner processes, using it
only with those that say they map it, and keeping a slot a failed runner
may still write into until that process is gone."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kit.daemonkit import wait_for_async
from kit.prockit import script_leaving_no_process

from cartonstore.config.runners import RunnerSettings
from cartonstore.errors import Unavailable
from cartonstore.runner.protocol import ARENA_OUTPUTS, ARENA_REGION
from cartonstore.server.runner_processes import InstanceSpec, ModelRunners
from cartonstore.server.tensors.arena import TRIM_KEEP, TensorArena
from cartonstore.server.tensors.arena_wire import ArenaForward
from cartonstore.v2.framing import parse_infer_request

MIB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")


def run(coro) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 40))


# -- slots --------------------------------------------------------------------------------


def test_slots_are_page_aligned_first_fit_and_refused_when_full() -> None:
    async def go() -> None:
        arena = TensorArena(4 * MIB)
        try:
            a, b, c = arena.take(10), arena.take(MIB), arena.take(PAGE)
            assert (a.offset, b.offset, c.offset) == (0, PAGE, PAGE + MIB)
            assert len(a.view) == 10 and a.size == 10
            b.release()
            d = arena.take(PAGE)
            assert d.offset == PAGE                       # the first gap that fits
            assert arena.take(4 * MIB) is None and arena.full == 1
            b.release()                                   # twice: nothing
            assert arena.in_use == 3
            for s in (a, c, d):
                s.release()
            assert arena.in_use == 0 and arena.stats() == {"slots": 0, "bytes": 0, "forwarded": 0, "full": 1}
            assert arena.take(0) is None
        finally:
            arena.close()
    run(go())


def test_the_arena_cannot_be_shrunk_or_grown() -> None:
    arena = TensorArena(MIB)
    try:
        for size in (0, 2 * MIB):
            with pytest.raises(PermissionError):
                os.ftruncate(arena.fd, size)
        assert os.fstat(arena.fd).st_size == MIB
    finally:
        arena.close()


def test_a_held_slot_is_released_only_when_its_process_is_gone() -> None:
    async def go() -> None:
        arena = TensorArena(MIB)
        try:
            slot = arena.take(100)
            exited = asyncio.get_running_loop().create_future()
            slot.hold_until(exited)
            slot.release()                       # the request's own release: the slot stays held
            await asyncio.sleep(0.05)            # the time a wrong release would take
            assert arena.in_use == 1
            exited.set_result(0)
            assert await wait_for_async(lambda: arena.in_use == 0)
        finally:
            arena.close()
    run(go())


def test_pages_past_the_kept_ones_are_given_back_when_idle() -> None:
    async def go() -> None:
        arena = TensorArena(TRIM_KEEP + 32 * MIB, trim_idle=0.0)
        try:
            low, high = arena.take(TRIM_KEEP), arena.take(16 * MIB)
            low.view[:] = b"x" * len(low.view)
            high.view[:] = b"y" * len(high.view)
            touched = os.fstat(arena.fd).st_blocks * 512
            assert touched >= TRIM_KEEP + 16 * MIB
            high.release()
            low.release()
            # the pages may be gone a moment before the trim has ended
            assert await wait_for_async(lambda: not arena.trimming and os.fstat(arena.fd).st_blocks * 512 <= TRIM_KEEP)
            assert arena.take(TRIM_KEEP + MIB) is not None   # the whole arena is usable again
        finally:
            arena.close()
    run(go())


# -- the forms on the wire ------------------------------------------------------------------


def _forward(arena: TensorArena, inputs: dict[str, np.ndarray], **extra: object) -> tuple[ArenaForward, bytes]:
    entries, chunks = [], []
    for name, array in inputs.items():
        entries.append({"name": name, "datatype": "FP32" if array.dtype == np.float32 else "INT64",
                        "shape": list(array.shape), "parameters": {"binary_data_size": array.nbytes}})
        chunks.append(array.tobytes())
    doc = {"id": "r1", "inputs": entries, **extra}
    header = json.dumps(doc).encode()
    body = header + b"".join(chunks)
    slot = arena.take(2 * len(body) + 64)
    slot.view[:len(body)] = body
    req = parse_infer_request(slot.view[:len(body)], len(header))
    return ArenaForward(slot, len(body), len(header), req), header


def test_the_runner_gets_the_inputs_where_they_lie_in_the_slot() -> None:
    arena = TensorArena(MIB)
    try:
        a, b = np.arange(6, dtype=np.float32), np.arange(3, dtype=np.int64)
        forward, header = _forward(arena, {"a": a, "b": b})
        (body,), headers = forward.runner_request()
        assert headers == {"Content-Type": "application/json"}
        doc = json.loads(body)
        assert doc["id"] == "r1"
        pa, pb = (entry["parameters"] for entry in doc["inputs"])
        assert pa == {"shared_memory_region": ARENA_REGION, "shared_memory_offset": len(header),
                      "shared_memory_byte_size": 24}
        assert pb["shared_memory_offset"] == len(header) + 24
        view = arena.view
        assert view[pa["shared_memory_offset"]:][:24] == a.tobytes()
        assert view[pb["shared_memory_offset"]:][:24] == b.tobytes()
        out = doc["parameters"][ARENA_OUTPUTS]
        assert out["offset"] % 64 == 0 and out["offset"] >= len(header) + 48
        assert out["offset"] + out["byte_size"] <= forward.slot.size
        assert arena.forwarded == 1
    finally:
        arena.close()


def test_the_answer_interleaves_arena_and_body_outputs_in_order() -> None:
    arena = TensorArena(MIB)
    try:
        forward, _ = _forward(arena, {"a": np.zeros(64, np.float32)})
        at = forward.out_offset
        arena.view[at:at + 8] = b"ARENA-01"
        answer_doc = {"model_name": "m", "outputs": [
            {"name": "p", "datatype": "UINT8", "shape": [8],
             "parameters": {"shared_memory_region": ARENA_REGION, "shared_memory_offset": at,
                            "shared_memory_byte_size": 8}},
            {"name": "q", "datatype": "UINT8", "shape": [4], "parameters": {"binary_data_size": 4}},
            {"name": "r", "datatype": "INT32", "shape": [1], "data": [7]},
            {"name": "s", "datatype": "UINT8", "shape": [2], "parameters": {"binary_data_size": 2}}]}
        head = json.dumps(answer_doc).encode()
        headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
        header, parts = forward.client_answer(headers, head + b"BODYxy", "runner for m")
        assert [bytes(p) for p in parts] == [b"ARENA-01", b"BODY", b"xy"]
        assert headers["Inference-Header-Content-Length"] == str(len(header))
        outs = json.loads(header)["outputs"]
        assert outs[0]["parameters"] == {"binary_data_size": 8}
        assert outs[2]["data"] == [7]
    finally:
        arena.close()


@pytest.mark.parametrize(("offset", "size"), [(0, 8), (None, 8), ("x", 8), ("end", 1), ("start", -1)])
def test_an_answer_pointing_outside_its_span_is_refused(offset: object, size: int) -> None:
    arena = TensorArena(MIB)
    try:
        forward, _ = _forward(arena, {"a": np.zeros(64, np.float32)})
        spot = {"end": forward.out_offset + forward.out_size, "start": forward.out_offset}.get(offset, offset)  # type: ignore[arg-type]  # offset: a name or a number, on purpose
        doc = {"outputs": [{"name": "p", "datatype": "UINT8", "shape": [8],
                            "parameters": {"shared_memory_region": ARENA_REGION, "shared_memory_offset": spot,
                                           "shared_memory_byte_size": size}}]}
        with pytest.raises(Unavailable, match="runner for m put output 'p' at .* outside the"):
            forward.client_answer({}, json.dumps(doc).encode(), "runner for m")
    finally:
        arena.close()


def test_an_answer_that_is_not_json_is_refused() -> None:
    arena = TensorArena(MIB)
    try:
        forward, _ = _forward(arena, {"a": np.zeros(64, np.float32)})
        for bad in (b"[1, 2]", b"\xff nope"):
            with pytest.raises(Unavailable, match="not a JSON object"):
                forward.client_answer({}, bad, "runner for m")
    finally:
        arena.close()


# -- with real runner processes ----------------------------------------------------------------

# Says it maps the arena when asked to (--arena) and it inherited it; answers each infer with what it
# got: the body, the fd it was given, and the first bytes of its first input, read from the arena.
RUNNER = r'''
import asyncio, json, mmap, os, sys
from aiohttp import web

sock, claims = sys.argv[1], "--arena" in sys.argv
fd = os.environ.get("CARTONSTORE_ARENA_FD")
arena = mmap.mmap(int(fd), 0) if fd else None

async def meta(request):
    return web.json_response({"extensions": ["cartonstore_arena"] if claims and arena is not None else []})

async def ready(request):
    return web.Response()

async def infer(request):
    body = await request.read()
    if b'"hang_up"' in body:   # alive, but ends the exchange without an answer
        request.transport.close()
        await asyncio.sleep(0.5)
        return web.Response()
    seen = None
    if body.startswith(b"{"):
        doc = json.loads(body)
        p = doc["inputs"][0].get("parameters", {})
        if "shared_memory_offset" in p and arena is not None:
            seen = arena[p["shared_memory_offset"]:p["shared_memory_offset"] + 4].decode()
    return web.json_response({"body": body[:2000].decode("latin-1"), "fd": fd, "seen": seen})

app = web.Application(client_max_size=1 << 30)
app.router.add_get("/v2", meta)
app.router.add_get("/v2/health/ready", ready)
app.router.add_post("/v2/models/m/infer", infer)
web.run_app(app, path=sock, print=None)
'''


@pytest.fixture
def script(short_tmp: Path) -> Iterator[Path]:
    with script_leaving_no_process(short_tmp / "arena_runner.py", RUNNER) as path:
        yield path


@asynccontextmanager
async def pooled(script: Path, short_tmp: Path, *flags: str) -> AsyncIterator[tuple[ModelRunners, TensorArena]]:
    """One runner instance of ``script`` with an arena; both gone after."""
    arena = TensorArena(MIB)
    sock = short_tmp / "r.sock"
    runners = ModelRunners("m", "1", [InstanceSpec([sys.executable, str(script), str(sock), *flags], {}, sock)],
                           RunnerSettings(ready_timeout=20, request_timeout=10, restart_backoff=0.05),
                           arena=arena)
    try:
        await runners.start()
        yield runners, arena
    finally:
        await runners.stop()
        arena.close()


def _request(arena: TensorArena, data: bytes, **extra: object) -> ArenaForward:
    forward, _ = _forward(arena, {"a": np.frombuffer(data, np.float32)}, **extra)
    return forward


def test_a_runner_that_maps_the_arena_gets_the_request_in_its_form(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        async with pooled(script, short_tmp, "--arena") as (runners, arena):
            assert runners.arena_capable
            forward = _request(arena, b"ABCDEFGH")
            answer = await runners.forward("/v2/models/m/infer", [b"the copied form"], {}, (), forward)
            got = json.loads(answer.body)
            assert answer.arena and got["seen"] == "ABCD" and got["fd"] is not None
            assert ARENA_OUTPUTS in json.loads(got["body"])["parameters"]
            forward.slot.release()
    run(go())


def test_a_runner_that_does_not_say_so_gets_the_copied_form(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        async with pooled(script, short_tmp) as (runners, arena):   # inherits the fd, but does not claim it
            assert not runners.arena_capable
            forward = _request(arena, b"ABCDEFGH")
            answer = await runners.forward("/v2/models/m/infer", [b"the copied form"], {}, (), forward)
            assert not answer.arena and json.loads(answer.body)["body"] == "the copied form"
            assert arena.forwarded == 0
            forward.slot.release()
            assert arena.in_use == 0
    run(go())


def test_a_slot_sent_to_a_runner_that_failed_is_kept_until_it_is_reaped(script: Path, short_tmp: Path) -> None:
    async def go() -> None:
        async with pooled(script, short_tmp, "--arena") as (runners, arena):
            forward = _request(arena, b"ABCDEFGH", parameters={"hang_up": True})
            with pytest.raises(Unavailable, match="broke the HTTP exchange"):
                await runners.forward("/v2/models/m/infer", [b"x"], {}, (), forward)
            forward.slot.release()       # what the front does once it answered: the hold wins
            await asyncio.sleep(0.5)
            assert arena.in_use == 1     # the runner lives on, and might still write into the slot
            await runners.stop()
            assert await wait_for_async(lambda: arena.in_use == 0)   # reaped: the slot is free
    run(go())


# -- the runner SDK's side ------------------------------------------------------------------------


@pytest.mark.parametrize("env", [{}, {"CARTONSTORE_ARENA_FD": "99"}, {"CARTONSTORE_ARENA_FD": "nope"}])
def test_a_runner_without_a_usable_arena_refuses_arena_requests(short_tmp: Path, env: dict) -> None:
    import subprocess

    from kit.runnerkit import python_echo_model_dir, runner_argv, stop_runner, unix_get, unix_request, wait_ready

    model = python_echo_model_dir(short_tmp, declare=[("x", "float32", ["N"])])
    sock = short_tmp / "sdk.sock"
    proc = subprocess.Popen(runner_argv("python", model, sock), env={**os.environ, **env},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(sock, proc=proc)
        assert "cartonstore_arena" not in unix_get(sock, "/v2")[1]["extensions"]
        for given, fragment in (({"offset": 0, "byte_size": 8}, "'cartonstore.arena'"),
                                ({"offset": -1, "byte_size": 8}, "cartonstore_arena_outputs must be"),
                                ("x", "cartonstore_arena_outputs must be")):
            doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}],
                   "parameters": {ARENA_OUTPUTS: given}}
            status, _, body = unix_request(sock, "POST", "/v2/models/m/infer", json.dumps(doc).encode(),
                                           {"Content-Type": "application/json"})
            assert status == 400 and fragment in json.loads(body)["error"], body
    finally:
        _, err = stop_runner(proc)
    if env:
        assert "is not usable" in err and "without the daemon's tensor arena" in err


def test_a_slot_taken_while_idle_keeps_the_pages() -> None:
    async def go() -> None:
        arena = TensorArena(TRIM_KEEP + 32 * MIB, trim_idle=0.3)
        try:
            big = arena.take(TRIM_KEEP + 8 * MIB)
            big.view[TRIM_KEEP:] = b"z" * (len(big.view) - TRIM_KEEP)
            big.release()
            small = arena.take(PAGE)      # before trim_idle: the next big request finds its pages
            await asyncio.sleep(0.5)      # past trim_idle: the clock is the subject
            assert os.fstat(arena.fd).st_blocks * 512 >= 8 * MIB
            small.release()
            assert await wait_for_async(lambda: os.fstat(arena.fd).st_blocks * 512 < 8 * MIB)
        finally:
            arena.close()
    run(go())


@pytest.mark.parametrize("length", ["abc", "-1", "0", "99999", "\u00b2"])
def test_an_answer_with_a_bad_header_length_is_refused(length: str) -> None:
    arena = TensorArena(MIB)
    try:
        forward, _ = _forward(arena, {"a": np.zeros(64, np.float32)})
        with pytest.raises(Unavailable, match="runner for m answered Inference-Header-Content-Length"):
            forward.client_answer({"Inference-Header-Content-Length": length}, b'{"outputs": []}', "runner for m")
    finally:
        arena.close()


def test_pages_are_given_back_without_an_event_loop_too() -> None:
    arena = TensorArena(TRIM_KEEP + 8 * MIB)
    try:
        low, high = arena.take(TRIM_KEEP), arena.take(4 * MIB)
        high.view[:] = b"y" * len(high.view)
        low.release()
        high.release()
        assert os.fstat(arena.fd).st_blocks * 512 < 4 * MIB
        assert arena.take(TRIM_KEEP + 4 * MIB) is not None
    finally:
        arena.close()


def test_a_retired_arena_closes_when_its_last_slot_is_given_back() -> None:
    """One arena per loaded version: unloading retires it. It gives no new
    slot, and closes once the answers still sent from its slots have left."""
    arena = TensorArena(MIB)
    slot = arena.take(4096)
    arena.retire()
    assert not arena.closed and arena.take(4096) is None
    slot.release()
    assert arena.closed
    idle = TensorArena(MIB)
    idle.retire()
    assert idle.closed
