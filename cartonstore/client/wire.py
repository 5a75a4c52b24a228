"""What the loader clients (leases.py) and the inference client
(infer.py) share: where the daemon listens, one request on its own
connection, error statuses and leases as Python values, and what a lease
keeper does next. Standard library only: a loader without an event loop
imports nothing else.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from cartonstore.errors import (
    CartonStoreError,
    Conflict,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from cartonstore.system.backoff import doubling

log = logging.getLogger("cartonstore.client")   # not __name__: the name leases.py documents

DEFAULT_TIMEOUT = 30.0
"""Seconds for one request (renew, release, ready)."""
DEFAULT_ACQUIRE_TIMEOUT = 3600.0
"""Seconds for ``acquire``: the daemon may be downloading the model."""
EXIT_TIMEOUT = 5.0
"""Seconds to stop a lease keeper, and again to release its lease, on exit."""
_RETRY_FIRST = 0.5

_STATUS_ERRORS: dict[int, type[CartonStoreError]] = {
    400: InvalidInput, 401: Unauthenticated, 403: PermissionDenied, 404: NotFound, 409: Conflict,
    503: Unavailable,
}


class DaemonUnavailable(Unavailable):
    """Nobody listens where the daemon should be: ``subject`` is the socket
    path or base URL."""


@dataclass(frozen=True)
class Lease:
    id: str
    path: Path
    manifest_sha256: str
    expires_at: float   # inf for a mounted volume's lease, which only its release ends


# -- the pure part: addresses, requests, responses ---------------------------------


def default_socket_path() -> Path:
    """``$CARTONSTORE_SOCKET``, else the default store root's socket, as the
    daemon finds it (store.layout.default_socket)."""
    env = os.environ.get("CARTONSTORE_SOCKET")
    if env:
        return Path(env)
    from cartonstore.store.root.layout import default_root, default_socket  # the store package is slow to import

    return default_socket(default_root())


@dataclass(frozen=True)
class Address:
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


def address(socket_path: str | os.PathLike[str] | None, base_url: str | None) -> Address:
    if base_url is None:
        path = Path(socket_path) if socket_path is not None else default_socket_path()
        return Address(path, "http://localhost", "localhost", None, "")
    if socket_path is not None:
        raise ValueError("give a socket path or a base_url, not both")
    url = urlsplit(base_url)
    if url.scheme != "http" or not url.hostname:
        raise ValueError(f"base_url must be http://HOST[:PORT], got {base_url!r}")
    prefix = url.path.rstrip("/")
    return Address(None, f"http://{url.netloc}{prefix}", url.hostname, url.port, prefix)


def not_listening(addr: Address) -> DaemonUnavailable:
    return DaemonUnavailable(f"no cartonstore daemon at {addr.where}: is `cartonstore serve` running?",
                             subject=addr.where)


def transport_error(addr: Address, e: BaseException) -> Unavailable:
    detail = str(e) or type(e).__name__
    return Unavailable(f"cartonstore daemon at {addr.where} did not answer: {detail}", subject=addr.where)


def error_for(status: int, body: bytes, subject: str | None) -> CartonStoreError:
    """The exception for an error response: the status picks the class, the
    daemon's ``{"error": ...}`` is the message."""
    details: dict[str, Any] = {}
    try:
        doc = json.loads(body)
        message = doc["error"]
        if not isinstance(message, str):
            raise TypeError(message)
        stderr = doc.get("stderr")   # a runner's last stderr lines, kept as lines
        if isinstance(stderr, list) and all(isinstance(line, str) for line in stderr):
            details["stderr"] = stderr
    except (ValueError, TypeError, KeyError, AttributeError):
        message = f"HTTP {status} from the cartonstore daemon: {body[:200].decode('utf-8', 'replace')!r}"
    return _STATUS_ERRORS.get(status, CartonStoreError)(message, subject=subject, details=details)


def json_body(status: int, body: bytes, subject: str | None) -> Any:
    if status != 200:
        raise error_for(status, body, subject)
    try:
        return json.loads(body) if body.strip() else {}
    except ValueError:
        raise CartonStoreError(f"the cartonstore daemon sent invalid JSON: {body[:200]!r}",
                               subject=subject) from None


def lease_from(data: Any, subject: str | None) -> Lease:
    try:
        return Lease(id=str(data["lease"]), path=Path(data["path"]),
                     manifest_sha256=str(data["manifest_sha256"]),
                     expires_at=math.inf if data["expires_at"] is None else float(data["expires_at"]))
    except (KeyError, TypeError, ValueError):
        raise CartonStoreError(f"the cartonstore daemon sent a malformed lease: {data!r}",
                               subject=subject) from None


def acquire_body(model: str, ttl: float, holder: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "ttl": ttl}
    if holder is not None:
        body["holder"] = holder
    return body


def lease_url(lease_id: str, action: str = "") -> str:
    return f"/v1/leases/{quote(lease_id, safe='')}{action}"


def check_ttl(ttl: float) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        raise InvalidInput(f"ttl must be a positive number of seconds, got {ttl!r}")
    return float(ttl)


class Keeper:
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
        return doubling(_RETRY_FIRST, self.interval, self.failures - 1)

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


class UnixHTTPConnection(http.client.HTTPConnection):
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


def exchange(addr: Address, method: str, path: str, payload: bytes | None, headers: dict[str, str],
             timeout: float) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection: (status, lower-cased headers, body).
    Transport failures become DaemonUnavailable / Unavailable."""
    if addr.socket_path is not None:
        conn: http.client.HTTPConnection = UnixHTTPConnection(addr.socket_path, timeout)
    else:
        conn = http.client.HTTPConnection(addr.host, addr.port, timeout=timeout)
    try:
        conn.request(method, addr.prefix + path, body=payload, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    except (FileNotFoundError, ConnectionRefusedError):
        raise not_listening(addr) from None
    except (OSError, http.client.HTTPException) as e:
        raise transport_error(addr, e) from e
    finally:
        conn.close()
