"""A client for loaders: lease a model directory from the cartonstore daemon.

A *loader* is a process (often in a container) that needs a model's files on
disk. It asks the daemon for a lease over the HTTP API (docs/http-api.md, "Leases"),
reads the directory the lease names, and keeps the lease alive while it
uses the files, so that ``gc`` never removes them underneath it::

    import cartonstore.client

    with cartonstore.client.model_path("resnet") as model_dir:
        model = load(model_dir)            # the lease is renewed meanwhile
        serve(model)
    # released here, also on an exception

Two clients with the same methods:

* :class:`Client` uses only the standard library (``http.client`` over an
  ``AF_UNIX`` socket), so loaders without an event loop do not pay for
  importing aiohttp. Its ``lease()`` renews from a daemon thread.
* :class:`AsyncClient` uses aiohttp. Its ``lease()`` renews from a task it
  owns and always stops and awaits before returning.

Both talk to the Unix socket ``$CARTONSTORE_SOCKET``, else the daemon's
default (``/run/cartonstore/cartonstore.sock`` for the host's store,
``<store root>/cartonstore.sock`` for another), unless given another socket path or a TCP
``base_url`` such as ``"http://127.0.0.1:8000"``.

Errors: a response with an error status raises the ``cartonstore.errors``
class of that status (404 NotFound, 400 InvalidInput, 409 Conflict,
503 Unavailable, anything else CartonStoreError), with the daemon's own
message. No daemon listening raises :class:`DaemonUnavailable`; any other
transport failure (a timeout, a dropped connection) raises ``Unavailable``.

Keeping a lease (``lease()`` of either client)
----------------------------------------------
* It renews every ``ttl / 3`` seconds, so two renewals in a row may fail
  before the lease expires.
* A failed renewal is logged (logger ``cartonstore.client``) and retried
  sooner, backing off from 0.5 s up to ``ttl / 3``.
* A renewal answered 404 means the lease expired (the loader was suspended,
  the daemon was unreachable for longer than ``ttl``). The keeper then takes a
  new lease on the same *manifest hash*, not on the original reference (a name
  may meanwhile point at another model). Model directories are named by their
  hash, so the new lease covers the very directory the loader holds, and the
  daemon re-materializes it if ``gc`` removed it in the gap. It keeps trying,
  logging each failure: giving up would only guarantee that the directory can
  go away.
* On exit (normal, exception, cancellation, KeyboardInterrupt) the keeper is
  stopped and the lease released, within about ``2 * EXIT_TIMEOUT`` seconds.
  A failed release is logged, not raised: it must not hide the exception
  that ended the block, and the daemon drops the lease at its expiry anyway.
  The async release is shielded from cancellation; the cancellation is
  re-raised once the release is done.
* A request cut off midway (a cancelled ``acquire``, a keeper stopped during
  a re-acquire) can leave a lease the client never heard of; it expires
  after ``ttl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from cartonstore.errors import CartonStoreError, NotFound, Unavailable

from .wire import (
    DEFAULT_ACQUIRE_TIMEOUT,
    DEFAULT_TIMEOUT,
    EXIT_TIMEOUT,
    DaemonUnavailable,
    Keeper,
    Lease,
    acquire_body,
    address,
    check_ttl,
    default_socket_path,
    exchange,
    json_body,
    lease_from,
    lease_url,
    not_listening,
    transport_error,
)

__all__ = [
    "DEFAULT_ACQUIRE_TIMEOUT", "DEFAULT_TIMEOUT", "EXIT_TIMEOUT", "AsyncClient", "Client",
    "DaemonUnavailable", "Lease", "default_socket_path", "model_path",
]

log = logging.getLogger(__name__)

# -- the synchronous client: standard library only -----------------------------------


class Client:
    """Blocking client of the daemon's lease API (standard library only).

    Each request uses its own connection, so one client may be shared by
    threads (``lease()`` renews from one). ``timeout`` bounds every blocking
    socket operation of a request; ``acquire`` has its own.
    """

    def __init__(self, socket_path: str | os.PathLike[str] | None = None, *, base_url: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self._addr = address(socket_path, base_url)
        self._timeout = timeout

    @property
    def where(self) -> str:
        """The socket path or base URL this client talks to."""
        return self._addr.where

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to free (no connection outlives a request); for symmetry
        with :class:`AsyncClient`."""

    def acquire(self, model: str, ttl: float = 60.0, holder: str | None = None, *,
                timeout: float = DEFAULT_ACQUIRE_TIMEOUT) -> Lease:
        """Lease ``model`` (a name, manifest hash or source) for ``ttl`` seconds."""
        body = self._request("POST", "/v1/leases", acquire_body(model, check_ttl(ttl), holder), model, timeout)
        return lease_from(body, model)

    def acquire_for_volume(self, model: str, volume_id: str, holder: str | None = None, *,
                           timeout: float = DEFAULT_ACQUIRE_TIMEOUT) -> Lease:
        """Lease ``model`` for the mounted volume ``volume_id``: the lease has
        no expiry, taking it again for the same volume answers the same lease
        (moved to the model named), and ``release(lease.id)`` alone ends it."""
        body: dict[str, Any] = {"model": model, "volume": volume_id}
        if holder is not None:
            body["holder"] = holder
        return lease_from(self._request("POST", "/v1/leases", body, model, timeout), model)

    def renew(self, lease_id: str, ttl: float) -> Lease:
        """Extend a lease to ``ttl`` seconds from now; NotFound if it expired."""
        body = self._request("POST", lease_url(lease_id, "/renew"), {"ttl": check_ttl(ttl)}, lease_id)
        return lease_from(body, lease_id)

    def release(self, lease_id: str, *, timeout: float | None = None) -> None:
        """Give a lease back; NotFound if it already expired or was released."""
        self._request("DELETE", lease_url(lease_id), None, lease_id, timeout)

    def collect(self, *, max_size: int | None = None, min_free: int | None = None, grace: float = 3600.0,
                dry_run: bool = False, timeout: float = DEFAULT_ACQUIRE_TIMEOUT,
                forget_unrecoverable: bool = False) -> dict[str, Any]:
        """Ask the daemon to collect garbage now; returns its report."""
        body = {"max_size": max_size, "min_free": min_free, "grace": grace, "dry_run": dry_run,
                "forget_unrecoverable": forget_unrecoverable}
        return self._request("POST", "/v1/gc", body, None, timeout)

    def ready(self) -> bool:
        """True if the daemon answers ready; False if it answers otherwise, or
        cannot be reached at all."""
        try:
            status, _ = self._exchange("GET", "/v2/health/ready", None, self._timeout)
        except Unavailable:
            return False
        return status == 200

    @contextlib.contextmanager
    def lease(self, model: str, ttl: float = 60.0, holder: str | None = None, *,
              timeout: float = DEFAULT_ACQUIRE_TIMEOUT) -> Iterator[Path]:
        """Lease ``model``, yield its directory, renew from a daemon thread
        until the block ends, then release (see the module docstring)."""
        keeper = Keeper(self.acquire(model, ttl, holder, timeout=timeout), float(ttl), holder, timeout)
        stop = threading.Event()
        thread = threading.Thread(target=self._keep, args=(keeper, stop), daemon=True,
                                  name=f"cartonstore-lease-{keeper.lease.id}")
        thread.start()
        try:
            yield keeper.lease.path
        finally:
            stop.set()
            thread.join(EXIT_TIMEOUT)
            if thread.is_alive():
                log.warning("lease keeper %s still busy after %.0fs; leaving it", thread.name, EXIT_TIMEOUT)
            self._release_quietly(keeper.lease.id)

    def _keep(self, keeper: Keeper, stop: threading.Event) -> None:
        while not stop.wait(keeper.delay()):
            try:
                if keeper.is_lost:
                    lease = self.acquire(keeper.lease.manifest_sha256, keeper.ttl, keeper.holder,
                                         timeout=keeper.acquire_timeout)
                else:
                    lease = self.renew(keeper.lease.id, keeper.ttl)
            except Exception as e:  # noqa: BLE001 - a keeper that dies loses the lease
                keeper.failed(e)
            else:
                keeper.succeeded(lease)

    def _release_quietly(self, lease_id: str) -> None:
        try:
            self.release(lease_id, timeout=EXIT_TIMEOUT)
        except NotFound:
            pass
        except CartonStoreError as e:
            log.warning("could not release lease %s (it expires by itself): %s", lease_id, e)

    def _request(self, method: str, path: str, body: Any, subject: str | None,
                 timeout: float | None = None) -> Any:
        status, data = self._exchange(method, path, body, self._timeout if timeout is None else timeout)
        return json_body(status, data, subject)

    def _exchange(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, bytes]:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        status, _headers, data = exchange(self._addr, method, path, payload, headers, timeout)
        return status, data


def model_path(model: str, ttl: float = 60.0, socket_path: str | os.PathLike[str] | None = None, *,
               base_url: str | None = None, holder: str | None = None,
               timeout: float = DEFAULT_ACQUIRE_TIMEOUT) -> contextlib.AbstractContextManager[Path]:
    """``with model_path("resnet") as d: load(d)``: :meth:`Client.lease` in one call."""
    return Client(socket_path, base_url=base_url).lease(model, ttl, holder, timeout=timeout)


# -- the asynchronous client: aiohttp ---------------------------------------------------


class AsyncClient:
    """aiohttp client of the daemon's lease API.

    Use as ``async with AsyncClient() as c:`` or call :meth:`close`. The
    session is opened on the first request, inside the running loop.
    """

    def __init__(self, socket_path: str | os.PathLike[str] | None = None, *, base_url: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self._addr = address(socket_path, base_url)
        self._timeout = timeout
        self._session: Any = None

    @property
    def where(self) -> str:
        """The socket path or base URL this client talks to."""
        return self._addr.where

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def acquire(self, model: str, ttl: float = 60.0, holder: str | None = None, *,
                      timeout: float = DEFAULT_ACQUIRE_TIMEOUT) -> Lease:
        """Lease ``model`` (a name, manifest hash or source) for ``ttl`` seconds."""
        body = acquire_body(model, check_ttl(ttl), holder)
        return lease_from(await self._request("POST", "/v1/leases", body, model, timeout), model)

    async def renew(self, lease_id: str, ttl: float) -> Lease:
        """Extend a lease to ``ttl`` seconds from now; NotFound if it expired."""
        body = {"ttl": check_ttl(ttl)}
        return lease_from(await self._request("POST", lease_url(lease_id, "/renew"), body, lease_id), lease_id)

    async def release(self, lease_id: str, *, timeout: float | None = None) -> None:
        """Give a lease back; NotFound if it already expired or was released."""
        await self._request("DELETE", lease_url(lease_id), None, lease_id, timeout)

    async def ready(self) -> bool:
        """True if the daemon answers ready; False if it answers otherwise, or
        cannot be reached at all."""
        try:
            status, _ = await self._exchange("GET", "/v2/health/ready", None, self._timeout)
        except Unavailable:
            return False
        return status == 200

    @contextlib.asynccontextmanager
    async def lease(self, model: str, ttl: float = 60.0, holder: str | None = None, *,
                    timeout: float = DEFAULT_ACQUIRE_TIMEOUT) -> AsyncIterator[Path]:
        """Lease ``model``, yield its directory, renew from a task until the
        block ends, then stop the task and release (see the module docstring)."""
        keeper = Keeper(await self.acquire(model, ttl, holder, timeout=timeout), float(ttl), holder, timeout)
        stop = asyncio.Event()
        task = asyncio.create_task(self._keep(keeper, stop), name=f"cartonstore-lease-{keeper.lease.id}")
        try:
            yield keeper.lease.path
        finally:
            await _uncancellable(self._close_lease(keeper, stop, task))

    async def _keep(self, keeper: Keeper, stop: asyncio.Event) -> None:
        while not await _wait_set(stop, keeper.delay()):
            try:
                if keeper.is_lost:
                    lease = await self.acquire(keeper.lease.manifest_sha256, keeper.ttl, keeper.holder,
                                               timeout=keeper.acquire_timeout)
                else:
                    lease = await self.renew(keeper.lease.id, keeper.ttl)
            except Exception as e:  # noqa: BLE001 - a keeper that dies loses the lease
                keeper.failed(e)
            else:
                keeper.succeeded(lease)

    async def _close_lease(self, keeper: Keeper, stop: asyncio.Event, task: asyncio.Task[None]) -> None:
        stop.set()
        # Let an in-flight renewal finish (it may be a re-acquire whose lease
        # we must know to release); cancel it if it takes too long.
        _done, pending = await asyncio.wait({task}, timeout=EXIT_TIMEOUT)
        if pending:
            log.warning("lease keeper %s still busy after %.0fs; cancelling it", task.get_name(), EXIT_TIMEOUT)
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        try:
            await self.release(keeper.lease.id, timeout=EXIT_TIMEOUT)
        except NotFound:
            pass
        except CartonStoreError as e:
            log.warning("could not release lease %s (it expires by itself): %s", keeper.lease.id, e)

    async def _request(self, method: str, path: str, body: Any, subject: str | None,
                       timeout: float | None = None) -> Any:
        status, data = await self._exchange(method, path, body, self._timeout if timeout is None else timeout)
        return json_body(status, data, subject)

    async def _exchange(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, bytes]:
        import aiohttp

        addr = self._addr
        session = self._open_session()
        try:
            async with session.request(method, addr.base_url + path, json=body,
                                       timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                return resp.status, await resp.read()
        except aiohttp.ClientConnectorError as e:
            if isinstance(e.os_error, (FileNotFoundError, ConnectionRefusedError)):
                raise not_listening(addr) from None
            raise transport_error(addr, e) from e
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise transport_error(addr, e) from e

    def _open_session(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            if self._addr.socket_path is not None:
                connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=os.fspath(self._addr.socket_path))
            else:
                connector = aiohttp.TCPConnector()
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session


async def _wait_set(event: asyncio.Event, delay: float) -> bool:
    """Wait up to ``delay`` seconds for ``event``; True if it is set."""
    try:
        await asyncio.wait_for(event.wait(), delay)
    except asyncio.TimeoutError:
        pass
    return event.is_set()


async def _uncancellable(coro: Any) -> None:
    """Run ``coro`` to its end even if the caller is cancelled meanwhile, then
    re-raise the cancellation. ``coro`` must bound its own duration."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while True:
        try:
            await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
