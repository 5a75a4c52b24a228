"""A client for loaders: lease a model directory from the cartonstore daemon.

A *loader* is a process (often in a container) that needs a model's files on
disk. It asks the daemon for a lease over the HTTP API (DESIGN.md, "HTTP
API"), reads the directory the lease names, and keeps the lease alive while it
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

Both talk to the Unix socket ``$CARTONSTORE_SOCKET``, else
``<store root>/cartonstore.sock``, unless given another socket path or a TCP
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
import http.client
import json
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from .errors import CartonStoreError, Conflict, InvalidInput, NotFound, Unavailable

__all__ = [
    "DEFAULT_ACQUIRE_TIMEOUT", "DEFAULT_TIMEOUT", "EXIT_TIMEOUT", "AsyncClient", "Client",
    "DaemonUnavailable", "Lease", "default_socket_path", "model_path",
]

log = logging.getLogger(__name__)

SOCKET_NAME = "cartonstore.sock"
DEFAULT_TIMEOUT = 30.0
"""Seconds for one request (renew, release, ready)."""
DEFAULT_ACQUIRE_TIMEOUT = 3600.0
"""Seconds for ``acquire``: the daemon may be downloading the model."""
EXIT_TIMEOUT = 5.0
"""Seconds to stop a lease keeper, and again to release its lease, on exit."""
_RETRY_FIRST = 0.5

_STATUS_ERRORS: dict[int, type[CartonStoreError]] = {
    400: InvalidInput, 404: NotFound, 409: Conflict, 503: Unavailable,
}


class DaemonUnavailable(Unavailable):
    """Nobody listens where the daemon should be: ``subject`` is the socket
    path or base URL."""


@dataclass(frozen=True)
class Lease:
    id: str
    path: Path
    manifest_sha256: str
    expires_at: float


# -- the pure part: addresses, requests, responses ---------------------------------


def default_socket_path() -> Path:
    """``$CARTONSTORE_SOCKET``, else ``cartonstore.sock`` in the default store root."""
    env = os.environ.get("CARTONSTORE_SOCKET")
    if env:
        return Path(env)
    from .store.layout import default_root  # the store package is slow to import

    return default_root() / SOCKET_NAME


@dataclass(frozen=True)
class _Address:
    """Where the daemon listens: a Unix socket, or (``socket_path`` None) an
    http base URL with its path prefix."""

    socket_path: Path | None
    base_url: str
    host: str
    port: int | None
    prefix: str

    @property
    def where(self) -> str:
        return str(self.socket_path) if self.socket_path else self.base_url


def _address(socket_path: str | os.PathLike[str] | None, base_url: str | None) -> _Address:
    if base_url is None:
        path = Path(socket_path) if socket_path is not None else default_socket_path()
        return _Address(path, "http://localhost", "localhost", None, "")
    if socket_path is not None:
        raise ValueError("give a socket path or a base_url, not both")
    url = urlsplit(base_url)
    if url.scheme != "http" or not url.hostname:
        raise ValueError(f"base_url must be http://HOST[:PORT], got {base_url!r}")
    prefix = url.path.rstrip("/")
    return _Address(None, f"http://{url.netloc}{prefix}", url.hostname, url.port, prefix)


def _not_listening(addr: _Address) -> DaemonUnavailable:
    return DaemonUnavailable(f"no cartonstore daemon at {addr.where}: is `cartonstore serve` running?",
                             subject=addr.where)


def _transport_error(addr: _Address, e: BaseException) -> Unavailable:
    detail = str(e) or type(e).__name__
    return Unavailable(f"cartonstore daemon at {addr.where} did not answer: {detail}", subject=addr.where)


def _error_for(status: int, body: bytes, subject: str | None) -> CartonStoreError:
    """The exception for an error response: the status picks the class, the
    daemon's ``{"error": ...}`` is the message."""
    try:
        message = json.loads(body)["error"]
        if not isinstance(message, str):
            raise TypeError(message)
    except (ValueError, TypeError, KeyError):
        message = f"HTTP {status} from the cartonstore daemon: {body[:200].decode('utf-8', 'replace')!r}"
    return _STATUS_ERRORS.get(status, CartonStoreError)(message, subject=subject)


def _json_body(status: int, body: bytes, subject: str | None) -> Any:
    if status != 200:
        raise _error_for(status, body, subject)
    try:
        return json.loads(body) if body.strip() else {}
    except ValueError:
        raise CartonStoreError(f"the cartonstore daemon sent invalid JSON: {body[:200]!r}",
                               subject=subject) from None


def _lease_from(data: Any, subject: str | None) -> Lease:
    try:
        return Lease(id=str(data["lease"]), path=Path(data["path"]),
                     manifest_sha256=str(data["manifest_sha256"]), expires_at=float(data["expires_at"]))
    except (KeyError, TypeError, ValueError):
        raise CartonStoreError(f"the cartonstore daemon sent a malformed lease: {data!r}",
                               subject=subject) from None


def _acquire_body(model: str, ttl: float, holder: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "ttl": ttl}
    if holder is not None:
        body["holder"] = holder
    return body


def _lease_url(lease_id: str, action: str = "") -> str:
    return f"/v1/leases/{quote(lease_id, safe='')}{action}"


def _check_ttl(ttl: float) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        raise InvalidInput(f"ttl must be a positive number of seconds, got {ttl!r}")
    return float(ttl)


class _Keeper:
    """What a lease keeper does next, decided from what happened last.

    The sync and async clients run the same loop around it: wait
    ``delay()``, then renew ``lease`` or, if ``is_lost``, re-acquire
    ``lease.manifest_sha256``, and report the outcome.
    """

    def __init__(self, lease: Lease, ttl: float, holder: str | None, acquire_timeout: float) -> None:
        self.lease = lease
        self.ttl = ttl
        self.holder = holder
        self.acquire_timeout = acquire_timeout
        self.interval = ttl / 3
        self.is_lost = False
        self.failures = 0

    def delay(self) -> float:
        if self.failures == 0:
            return self.interval
        if self.is_lost and self.failures == 1:
            return 0.0
        return min(self.interval, _RETRY_FIRST * 2 ** (self.failures - 1))

    def succeeded(self, lease: Lease) -> None:
        if self.is_lost:
            log.info("re-acquired model %s as lease %s", lease.manifest_sha256, lease.id)
            if lease.path != self.lease.path:
                log.error("re-acquired model %s at %s, not at %s where it is in use",
                          lease.manifest_sha256, lease.path, self.lease.path)
        self.lease, self.is_lost, self.failures = lease, False, 0

    def failed(self, e: BaseException) -> None:
        self.failures += 1
        what = f"model {self.lease.manifest_sha256} (lease {self.lease.id})"
        if isinstance(e, NotFound) and not self.is_lost:
            log.warning("lease %s on %s is gone (expired?); taking a new one", self.lease.id,
                        self.lease.manifest_sha256)
            self.is_lost, self.failures = True, 1
        elif self.is_lost:
            log.error("cannot re-acquire %s, retrying in %.1fs: %s", what, self.delay(), e)
        elif isinstance(e, CartonStoreError):
            log.warning("cannot renew %s, retrying in %.1fs: %s", what, self.delay(), e)
        else:
            log.error("unexpected error renewing %s, retrying in %.1fs", what, self.delay(), exc_info=e)


# -- the synchronous client: standard library only -----------------------------------


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(os.fspath(self._path))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class Client:
    """Blocking client of the daemon's lease API (standard library only).

    Each request uses its own connection, so one client may be shared by
    threads (``lease()`` renews from one). ``timeout`` bounds every blocking
    socket operation of a request; ``acquire`` has its own.
    """

    def __init__(self, socket_path: str | os.PathLike[str] | None = None, *, base_url: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self._addr = _address(socket_path, base_url)
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
        body = self._request("POST", "/v1/leases", _acquire_body(model, _check_ttl(ttl), holder), model, timeout)
        return _lease_from(body, model)

    def renew(self, lease_id: str, ttl: float) -> Lease:
        """Extend a lease to ``ttl`` seconds from now; NotFound if it expired."""
        body = self._request("POST", _lease_url(lease_id, "/renew"), {"ttl": _check_ttl(ttl)}, lease_id)
        return _lease_from(body, lease_id)

    def release(self, lease_id: str, *, timeout: float | None = None) -> None:
        """Give a lease back; NotFound if it already expired or was released."""
        self._request("DELETE", _lease_url(lease_id), None, lease_id, timeout)

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
        keeper = _Keeper(self.acquire(model, ttl, holder, timeout=timeout), float(ttl), holder, timeout)
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

    def _keep(self, keeper: _Keeper, stop: threading.Event) -> None:
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
        return _json_body(status, data, subject)

    def _exchange(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, bytes]:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        status, _headers, data = exchange(self._addr, method, path, payload, headers, timeout)
        return status, data


def exchange(addr: _Address, method: str, path: str, payload: bytes | None, headers: dict[str, str],
             timeout: float) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection: (status, lower-cased headers, body).
    Transport failures become DaemonUnavailable / Unavailable."""
    if addr.socket_path is not None:
        conn: http.client.HTTPConnection = _UnixHTTPConnection(addr.socket_path, timeout)
    else:
        conn = http.client.HTTPConnection(addr.host, addr.port, timeout=timeout)
    try:
        conn.request(method, addr.prefix + path, body=payload, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    except (FileNotFoundError, ConnectionRefusedError):
        raise _not_listening(addr) from None
    except (OSError, http.client.HTTPException) as e:
        raise _transport_error(addr, e) from e
    finally:
        conn.close()


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
        self._addr = _address(socket_path, base_url)
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
        body = _acquire_body(model, _check_ttl(ttl), holder)
        return _lease_from(await self._request("POST", "/v1/leases", body, model, timeout), model)

    async def renew(self, lease_id: str, ttl: float) -> Lease:
        """Extend a lease to ``ttl`` seconds from now; NotFound if it expired."""
        body = {"ttl": _check_ttl(ttl)}
        return _lease_from(await self._request("POST", _lease_url(lease_id, "/renew"), body, lease_id), lease_id)

    async def release(self, lease_id: str, *, timeout: float | None = None) -> None:
        """Give a lease back; NotFound if it already expired or was released."""
        await self._request("DELETE", _lease_url(lease_id), None, lease_id, timeout)

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
        keeper = _Keeper(await self.acquire(model, ttl, holder, timeout=timeout), float(ttl), holder, timeout)
        stop = asyncio.Event()
        task = asyncio.create_task(self._keep(keeper, stop), name=f"cartonstore-lease-{keeper.lease.id}")
        try:
            yield keeper.lease.path
        finally:
            await _uncancellable(self._close_lease(keeper, stop, task))

    async def _keep(self, keeper: _Keeper, stop: asyncio.Event) -> None:
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

    async def _close_lease(self, keeper: _Keeper, stop: asyncio.Event, task: asyncio.Task[None]) -> None:
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
        return _json_body(status, data, subject)

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
                raise _not_listening(addr) from None
            raise _transport_error(addr, e) from e
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise _transport_error(addr, e) from e

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
