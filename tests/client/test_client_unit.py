"""The loader clients (cartonstore.client) against a real HTTP server.

``FakeDaemon`` is a tiny aiohttp app implementing the lease endpoints with an
in-memory table, served on a real Unix socket (and a loopback TCP port) from
its own event loop in a thread, so the blocking and the async client both
talk to it over the wire. Errors are asked for by model name
(``fail-409``) or queued for renewals (``renew_faults``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from aiohttp import web
from kit.daemonkit import wait_for, wait_for_async

from cartonstore.client import leases as cs
from cartonstore.errors import CartonStoreError, Conflict, InvalidInput, NotFound, Unavailable

TTL = 0.6  # renewals every 0.2 s


class FakeDaemon:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket_path = root / "d.sock"
        self.port: int | None = None
        self.leases: dict[str, dict] = {}
        self.calls: list[tuple[str, str, dict]] = []
        self.renew_faults: list[int] = []
        self.is_ready = True
        self._ids = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    # ---- test-side view ------------------------------------------------------

    def count(self, method: str, suffix: str = "") -> int:
        with self._lock:
            return sum(1 for m, p, _ in self.calls if m == method and p.endswith(suffix))

    def bodies(self, method: str, suffix: str = "") -> list[dict]:
        with self._lock:
            return [b for m, p, b in self.calls if m == method and p.endswith(suffix)]

    def expire(self, lease_id: str) -> None:
        with self._lock:
            self.leases.pop(lease_id)

    def live(self) -> set[str]:
        with self._lock:
            return set(self.leases)

    # ---- lifecycle -------------------------------------------------------------

    def __enter__(self) -> FakeDaemon:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/leases", self._acquire)
        app.router.add_post("/v1/leases/{id}/renew", self._renew)
        app.router.add_delete("/v1/leases/{id}", self._release)
        app.router.add_get("/v2/health/ready", self._ready)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(self.socket_path)).start()
        tcp = web.TCPSite(self._runner, "127.0.0.1", 0)
        await tcp.start()
        self.port = tcp._server.sockets[0].getsockname()[1]

    # ---- handlers (loop thread) ------------------------------------------------

    async def _body(self, request: web.Request) -> dict:
        raw = await request.read()
        body = json.loads(raw) if raw else {}
        with self._lock:
            self.calls.append((request.method, request.path, body))
        return body

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response({"error": message}, status=status)

    def _granted(self, lease_id: str) -> web.Response:
        row = self.leases[lease_id]
        return web.json_response({"lease": lease_id, "path": str(self.root / "models" / row["digest"]),
                                  "manifest_sha256": row["digest"], "expires_at": row["expires_at"]})

    async def _acquire(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        model, ttl = body.get("model"), body.get("ttl")
        if isinstance(model, str) and model.startswith("fail-"):
            status = int(model[len("fail-"):])
            if status == 502:
                return web.Response(status=502, text="<html>bad gateway</html>")
            return self._error(status, f"{model} failed as asked")
        if not isinstance(ttl, (int, float)) or ttl <= 0:
            return self._error(400, f"ttl must be positive, got {ttl!r}")
        digest = model if len(model) == 64 else hashlib.sha256(model.encode()).hexdigest()
        with self._lock:
            self._ids += 1
            lease_id = f"L{self._ids}"
            self.leases[lease_id] = {"digest": digest, "holder": body.get("holder"),
                                     "expires_at": time.time() + ttl}
        return self._granted(lease_id)

    async def _renew(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        lease_id = request.match_info["id"]
        with self._lock:
            fault = self.renew_faults.pop(0) if self.renew_faults else None
            if fault is None and lease_id in self.leases:
                self.leases[lease_id]["expires_at"] = time.time() + body["ttl"]
        if fault is not None:
            return self._error(fault, "renewals are failing as asked")
        if lease_id not in self.leases:
            return self._error(404, f"no lease {lease_id!r}")
        return self._granted(lease_id)

    async def _release(self, request: web.Request) -> web.Response:
        await self._body(request)
        with self._lock:
            row = self.leases.pop(request.match_info["id"], None)
        if row is None:
            return self._error(404, f"no lease {request.match_info['id']!r}")
        return web.json_response({})

    async def _ready(self, request: web.Request) -> web.Response:
        await self._body(request)
        return web.json_response({}) if self.is_ready else web.Response(status=400)


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[FakeDaemon]:
    with FakeDaemon(short_tmp) as d:
        yield d


@pytest.fixture
def stale_socket(short_tmp: Path) -> Path:
    """A socket file nobody listens on (a daemon that died)."""
    path = short_tmp / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()
    return path


def digest_of(model: str) -> str:
    return hashlib.sha256(model.encode()).hexdigest()


def run(coro) -> Any:
    return asyncio.run(coro)


async def with_async(daemon: FakeDaemon, fn, **kw) -> Any:
    async with cs.AsyncClient(daemon.socket_path, **kw) as c:
        return await fn(c)


def lease_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("cartonstore-lease-")]


# ---- acquire / renew / release -------------------------------------------------------


def test_sync_acquire_renew_release(daemon: FakeDaemon) -> None:
    c = cs.Client(daemon.socket_path)
    lease = c.acquire("resnet", ttl=30, holder="worker-1")
    assert lease == cs.Lease(lease.id, daemon.root / "models" / digest_of("resnet"), digest_of("resnet"),
                             lease.expires_at)
    assert isinstance(lease.path, Path) and lease.expires_at > time.time() + 25
    assert daemon.bodies("POST", "/v1/leases") == [{"model": "resnet", "ttl": 30.0, "holder": "worker-1"}]
    renewed = c.renew(lease.id, 100)
    assert renewed.id == lease.id and renewed.expires_at > time.time() + 95
    c.release(lease.id)
    assert daemon.live() == set()
    with pytest.raises(NotFound, match="no lease"):
        c.release(lease.id)


def test_async_acquire_renew_release(daemon: FakeDaemon) -> None:
    async def go(c: cs.AsyncClient) -> tuple[cs.Lease, cs.Lease]:
        lease = await c.acquire("resnet")
        renewed = await c.renew(lease.id, 100)
        await c.release(lease.id)
        return lease, renewed

    lease, renewed = run(with_async(daemon, go))
    assert lease.path == daemon.root / "models" / digest_of("resnet")
    assert lease.manifest_sha256 == digest_of("resnet") and renewed.id == lease.id
    assert daemon.bodies("POST", "/v1/leases") == [{"model": "resnet", "ttl": 60.0}]  # no holder sent
    assert daemon.live() == set()


def test_ready(daemon: FakeDaemon, stale_socket: Path) -> None:
    assert cs.Client(daemon.socket_path).ready() is True
    assert run(with_async(daemon, lambda c: c.ready())) is True
    daemon.is_ready = False
    assert cs.Client(daemon.socket_path).ready() is False
    assert run(with_async(daemon, lambda c: c.ready())) is False
    assert cs.Client(stale_socket).ready() is False

    async def stale() -> bool:
        async with cs.AsyncClient(stale_socket) as c:
            return await c.ready()

    assert run(stale()) is False


@pytest.mark.parametrize("ttl", [0, -1, True])
def test_bad_ttl_is_refused_before_asking(daemon: FakeDaemon, ttl) -> None:
    with pytest.raises(InvalidInput, match="ttl"):
        cs.Client(daemon.socket_path).acquire("m", ttl=ttl)
    assert daemon.calls == []


# ---- error mapping -------------------------------------------------------------------

ERRORS = [(400, InvalidInput), (404, NotFound), (409, Conflict), (503, Unavailable), (500, CartonStoreError)]


@pytest.mark.parametrize(("status", "cls"), ERRORS)
def test_sync_error_mapping(daemon: FakeDaemon, status: int, cls: type) -> None:
    with pytest.raises(cls) as info:
        cs.Client(daemon.socket_path).acquire(f"fail-{status}")
    assert type(info.value) is cls
    assert str(info.value) == f"fail-{status} failed as asked"
    assert info.value.subject == f"fail-{status}"


@pytest.mark.parametrize(("status", "cls"), ERRORS)
def test_async_error_mapping(daemon: FakeDaemon, status: int, cls: type) -> None:
    async def go(c) -> BaseException:
        with pytest.raises(cls) as info:
            await c.acquire(f"fail-{status}")
        return info.value

    e = run(with_async(daemon, go))
    assert type(e) is cls and str(e) == f"fail-{status} failed as asked"


def test_non_json_error_body(daemon: FakeDaemon) -> None:
    with pytest.raises(CartonStoreError, match="HTTP 502.*bad gateway"):
        cs.Client(daemon.socket_path).acquire("fail-502")


def test_lease_errors_name_the_lease(daemon: FakeDaemon) -> None:
    # "/" in an id is quoted, so it reaches the renew route whole
    with pytest.raises(NotFound) as info:
        cs.Client(daemon.socket_path).renew("no/such", 5)
    assert str(info.value) == "no lease 'no/such'" and info.value.subject == "no/such"
    assert daemon.bodies("POST", "/renew") == [{"ttl": 5.0}]


# ---- no daemon -------------------------------------------------------------------------


def test_sync_daemon_not_running(short_tmp: Path, stale_socket: Path) -> None:
    for path in (short_tmp / "missing.sock", stale_socket):
        with pytest.raises(cs.DaemonUnavailable) as info:
            cs.Client(path).acquire("m")
        assert str(info.value) == f"no cartonstore daemon at {path}: is `cartonstore serve` running?"
        assert isinstance(info.value, Unavailable) and info.value.subject == str(path)


def test_async_daemon_not_running(short_tmp: Path, stale_socket: Path) -> None:
    async def go(path) -> str:
        async with cs.AsyncClient(path) as c:
            with pytest.raises(cs.DaemonUnavailable) as info:
                await c.acquire("m")
            return str(info.value)

    for path in (short_tmp / "missing.sock", stale_socket):
        assert run(go(path)) == f"no cartonstore daemon at {path}: is `cartonstore serve` running?"


def test_tcp_nobody_listening() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    with pytest.raises(cs.DaemonUnavailable, match="no cartonstore daemon at http://127.0.0.1"):
        cs.Client(base_url=url).acquire("m")

    async def go() -> None:
        async with cs.AsyncClient(base_url=url) as c:
            await c.acquire("m")

    with pytest.raises(cs.DaemonUnavailable):
        run(go())


# ---- addresses --------------------------------------------------------------------------


def test_base_url_tcp(daemon: FakeDaemon) -> None:
    url = f"http://127.0.0.1:{daemon.port}/"
    lease = cs.Client(base_url=url).acquire("over-tcp")
    assert lease.manifest_sha256 == digest_of("over-tcp")

    async def go() -> None:
        async with cs.AsyncClient(base_url=url) as c:
            await c.release(lease.id)

    run(go())
    assert daemon.live() == set()


def test_socket_from_env(daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARTONSTORE_SOCKET", str(daemon.socket_path))
    assert cs.default_socket_path() == daemon.socket_path
    assert cs.Client().where == str(daemon.socket_path)
    lease = cs.Client().acquire("from-env")

    async def go() -> None:
        async with cs.AsyncClient() as c:
            await c.release(lease.id)

    run(go())
    assert daemon.live() == set()


def test_socket_defaults_to_store_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CARTONSTORE_SOCKET", raising=False)
    monkeypatch.setenv("CARTONSTORE_ROOT", str(tmp_path))
    assert cs.Client().where == str(tmp_path / "cartonstore.sock")
    assert cs.AsyncClient().where == str(tmp_path / "cartonstore.sock")


@pytest.mark.parametrize("kw", [{"socket_path": "/x.sock", "base_url": "http://h:1"},
                                {"base_url": "https://h:1"}, {"base_url": "unix:///x"}])
def test_bad_addresses(kw) -> None:
    with pytest.raises(ValueError):
        cs.Client(**kw)


# ---- keeping a lease ----------------------------------------------------------------------


def test_sync_lease_renews_and_releases(daemon: FakeDaemon) -> None:
    with cs.model_path("resnet", ttl=TTL, socket_path=daemon.socket_path, holder="h") as d:
        assert d == daemon.root / "models" / digest_of("resnet")
        (lease_id,) = daemon.live()
        assert wait_for(lambda: daemon.count("POST", "/renew") >= 2)
        assert daemon.bodies("POST", "/renew")[0] == {"ttl": TTL}
    assert daemon.live() == set()
    assert daemon.count("DELETE", f"/v1/leases/{lease_id}") == 1
    assert lease_threads() == []


def test_sync_lease_releases_on_exception(daemon: FakeDaemon) -> NoReturn:
    with pytest.raises(RuntimeError, match="loader failed"), cs.Client(daemon.socket_path).lease("m", ttl=TTL):
        assert len(daemon.live()) == 1
        raise RuntimeError("loader failed")
    assert daemon.live() == set() and lease_threads() == []


def test_sync_lease_survives_failures_and_loss(daemon: FakeDaemon, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cartonstore.client")
    with cs.Client(daemon.socket_path).lease("bert", ttl=TTL) as d:
        (first,) = daemon.live()
        daemon.renew_faults[:] = [503, 500]
        assert wait_for(lambda: not daemon.renew_faults and daemon.count("POST", "/renew") >= 3)
        daemon.expire(first)  # the daemon dropped it: the next renewal gets 404
        assert wait_for(lambda: len(daemon.live()) == 1 and daemon.live() != {first})
        assert daemon.bodies("POST", "/v1/leases")[-1]["model"] == digest_of("bert")  # pinned by hash
        assert d == daemon.root / "models" / digest_of("bert")
        (second,) = daemon.live()
    assert daemon.live() == set()
    assert daemon.count("DELETE", f"/v1/leases/{second}") == 1
    text = caplog.text
    assert "cannot renew" in text and "renewals are failing as asked" in text
    assert f"lease {first} on {digest_of('bert')} is gone" in text and "re-acquired" in text


def test_sync_lease_exit_without_daemon_does_not_raise(short_tmp: Path, caplog) -> None:
    d = FakeDaemon(short_tmp).__enter__()
    try:
        cm = cs.Client(d.socket_path).lease("m", ttl=TTL)
        cm.__enter__()
    finally:
        d.__exit__(None, None, None)
    cm.__exit__(None, None, None)  # release fails: logged, not raised
    assert "could not release" in caplog.text and lease_threads() == []


def test_async_lease_renews_and_releases(daemon: FakeDaemon) -> None:
    async def go() -> set[asyncio.Task[Any]]:
        async with cs.AsyncClient(daemon.socket_path) as c:
            async with c.lease("resnet", ttl=TTL) as d:
                assert d == daemon.root / "models" / digest_of("resnet")
                assert await wait_for_async(lambda: daemon.count("POST", "/renew") >= 2)
            return asyncio.all_tasks()

    tasks = run(go())
    assert len(tasks) == 1  # only the main task: the keeper was awaited
    assert daemon.live() == set() and daemon.count("DELETE") == 1


def test_async_lease_releases_on_exception(daemon: FakeDaemon) -> None:
    async def go() -> set[asyncio.Task[Any]]:
        async with cs.AsyncClient(daemon.socket_path) as c:
            with pytest.raises(KeyError):
                async with c.lease("m", ttl=TTL):
                    raise KeyError("boom")
            return asyncio.all_tasks()

    assert len(run(go())) == 1
    assert daemon.live() == set()


def test_async_lease_releases_on_cancellation(daemon: FakeDaemon) -> None:
    entered = []

    async def body(c) -> None:
        async with c.lease("m", ttl=TTL):
            entered.append(True)
            await asyncio.sleep(30)

    async def go() -> Any:
        async with cs.AsyncClient(daemon.socket_path) as c:
            task = asyncio.create_task(body(c))
            assert await wait_for_async(lambda: entered and daemon.count("POST", "/renew") >= 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            task_left = asyncio.all_tasks()
        return task_left

    assert len(run(go())) == 1
    assert daemon.count("POST", "/renew") >= 1
    assert daemon.live() == set() and daemon.count("DELETE") == 1


def test_async_lease_reacquires_lost_lease(daemon: FakeDaemon) -> None:
    async def go() -> Any:
        async with cs.AsyncClient(daemon.socket_path) as c:
            async with c.lease("bert", ttl=TTL):
                (first,) = daemon.live()
                daemon.renew_faults.append(503)
                daemon.expire(first)
                assert await wait_for_async(lambda: len(daemon.live()) == 1)
                (second,) = daemon.live()
            return first, second

    first, second = run(go())
    assert first != second
    assert daemon.bodies("POST", "/v1/leases")[-1]["model"] == digest_of("bert")
    assert daemon.live() == set() and daemon.count("DELETE", f"/{second}") == 1


def test_a_keeper_that_keeps_failing_waits_at_most_its_interval() -> None:
    """A daemon gone for hours: the keeper's doubling retry delay holds at
    the renewal interval, however many renewals have failed."""
    from cartonstore.client.wire import Keeper, Lease

    keeper = Keeper(Lease("l", Path("/m"), "0" * 64, 0.0), 60.0, None, 1.0)
    keeper.failures = 1
    first = keeper.delay()
    keeper.failures = 5000
    assert first < keeper.delay() == keeper.interval == 20.0
