"""HTTP GETs with the rules cartonstore needs, over one aiohttp session.

aiohttp's own decompression and redirect following are off: bodies come
raw (ContentDecoder decodes them, so hashes are of decoded bytes and bombs
are bounded), and each redirect hop is re-checked against the URL policy.
aiohttp's exceptions are translated into FetchError here, once.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import re
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import aiohttp
from multidict import CIMultiDictProxy

from cartonstore.errors import FetchError, FetchNotFound, InvalidInput
from cartonstore.system.backoff import doubling, equal_jitter

from .config import FetchConfig, PeerConfig
from .content_encoding import parse_content_encoding
from .policy import RefusedByPolicy, describe, redirect_target
from .proxies import proxy_for
from .resolver import AddressRefused, GuardedResolver, proxy_endpoints
from .source_kinds import AnswererFactory, ChallengeAnswerer

T = TypeVar("T")
# Each chunk is one hop to the stream's hashing thread; 1 MiB keeps hops rare
# (a few hundred per GiB: bodies arrive in 256 KiB reads, joined up to this)
# and what a stream holds small: two chunks at most, one being written while
# the next is read. At 4 MiB, eight streams raised an add's peak RSS by 80 MiB.
CHUNK = 1 << 20
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_RETRYABLE_STATUS = {408, 425, 429, 500, 502, 503, 504}


@dataclass
class Response:
    url: str                      # after redirects
    status: int
    headers: CIMultiDictProxy[str]
    start: int                    # offset of the body's first byte in the resource
    length: int | None            # body bytes announced (Content-Length), encoded
    total: int | None             # size of the whole resource when known
    encodings: tuple[str, ...]
    raw: aiohttp.ClientResponse
    stall_timeout: float | None = None   # the client's: a body read past aiohttp (socket_body.py) keeps it

    @property
    def accepts_ranges(self) -> bool:
        return self.status == 206 or self.headers.get("Accept-Ranges", "").lower() == "bytes"

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; a stall, a reset or a short body raise FetchError."""
        try:
            async for chunk in self.raw.content.iter_chunked(CHUNK):
                yield chunk
        except Exception as e:  # translated at this boundary
            raise translate(e, self.url) from e


def translate(e: BaseException, url: str) -> FetchError:
    where = describe(url)
    if isinstance(e, FetchError):
        return e
    if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        return FetchError(f"{where}: timed out (no bytes received within the stall timeout)",
                          subject=url, retryable=True)
    if isinstance(e, aiohttp.ClientPayloadError):
        return FetchError(f"{where}: body ended early or was malformed ({_reason(e)})", subject=url,
                          retryable=True)
    if isinstance(e, aiohttp.ClientConnectorError) and isinstance(e.os_error, AddressRefused):
        return RefusedByPolicy(f"{where}: {e.os_error}", subject=url)   # no connection was tried
    if isinstance(e, aiohttp.ClientConnectorError):  # its str() is aiohttp's ("... ssl:default [...]")
        return FetchError(f"{where}: cannot connect to {e.host}:{e.port}: {_connect_reason(e)}", subject=url,
                          retryable=True)
    if isinstance(e, aiohttp.ClientConnectionError):
        return FetchError(f"{where}: connection failed ({_reason(e)})", subject=url, retryable=True)
    if isinstance(e, aiohttp.ClientError):
        return FetchError(f"{where}: HTTP error ({_reason(e)})", subject=url, retryable=False)
    if isinstance(e, (ConnectionError, OSError)):
        return FetchError(f"{where}: connection failed ({e})", subject=url, retryable=True)
    raise e


def _connect_reason(e: aiohttp.ClientConnectorError) -> str:
    """Why a connection could not be made, in the words of the OS."""
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        return f"TLS certificate not accepted ({e.certificate_error})"
    os_error = e.os_error
    if isinstance(os_error, ssl.SSLError):  # an OSError whose errno (1) would read "operation not permitted"
        return tls_reason(os_error)
    if isinstance(os_error, socket.gaierror):
        return "cannot resolve the host name"
    if isinstance(os_error, (asyncio.TimeoutError, TimeoutError)):
        return "timed out"
    # Every address of a host failing (localhost: ::1 and 127.0.0.1) comes as "Multiple exceptions".
    errnos = {os_error.errno} if os_error.errno else {int(n) for n in re.findall(r"\[Errno (\d+)\]", str(os_error))}
    return os.strerror(errnos.pop()).lower() if len(errnos) == 1 else _reason(os_error)


def tls_reason(e: ssl.SSLError) -> str:
    """aiohttp's ClientConnectorSSLError is an ssl.SSLError too; the OS's is inside it."""
    inner = getattr(e, "os_error", None) or e
    why = getattr(inner, "reason", None) or getattr(inner, "strerror", None) or _reason(inner)
    return f"TLS handshake failed ({why})"


def _reason(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text.splitlines()[0][:200]


def trust_context(ca_file: Path, field: str = "registries.ca_file") -> ssl.SSLContext:
    """The system's CAs plus those in ca_file (a private registry's or origin's)."""
    context = ssl.create_default_context()
    try:
        context.load_verify_locations(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as e:
        raise InvalidInput(f"{field} {ca_file}: cannot load CA certificates "
                           f"({getattr(e, 'strerror', None) or e})", subject=str(ca_file)) from None
    return context


def peer_context(peers: PeerConfig) -> ssl.SSLContext | None:
    """The TLS context for https peers: their CA, and this node's client
    certificate (mTLS); None when neither is set (the session's own)."""
    if peers.ca_file is None and peers.tls_cert is None:
        return None
    context = trust_context(peers.ca_file, "peers.ca_file") if peers.ca_file else ssl.create_default_context()
    if peers.tls_cert is not None:
        try:
            context.load_cert_chain(str(peers.tls_cert), str(peers.tls_key) if peers.tls_key else None)
        except (OSError, ssl.SSLError) as e:
            raise InvalidInput(f"peers.tls_cert {peers.tls_cert}: cannot load the certificate and key "
                               f"({getattr(e, 'strerror', None) or e})", subject=str(peers.tls_cert)) from None
    return context


def parse_content_range(value: str | None) -> tuple[int, int, int | None] | None:
    m = _CONTENT_RANGE.match((value or "").strip())
    if not m:
        return None
    total = None if m.group(3) == "*" else int(m.group(3))
    return int(m.group(1)), int(m.group(2)), total


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def backoff_delay(attempt: int, config: FetchConfig, retry_after: float | None = None,
                  rng: random.Random | None = None) -> float:
    """The wait before retry ``attempt`` + 1: doubling from fetch.backoff_base
    up to fetch.backoff_max, with equal jitter; a server's Retry-After wins (capped)."""
    if retry_after is not None:
        return min(retry_after, config.backoff_max)
    return equal_jitter(doubling(config.backoff_base, config.backoff_max, attempt), rng)


class HttpClient:
    def __init__(self, config: FetchConfig, *, answerer: AnswererFactory | None = None) -> None:
        """``answerer`` makes what answers a 401's challenges (source_kinds.py);
        without one a 401 is an error like any other status."""
        self.config = config
        self._make_answerer = answerer
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        self._links: aiohttp.ClientSession | None = None
        self._links_resolver: GuardedResolver | None = None
        self._session_options: dict = {}
        self._tls: ssl.SSLContext | bool = True
        self._auth: ChallengeAnswerer | None = None
        self._peer_tls: ssl.SSLContext | None = None

    async def __aenter__(self) -> HttpClient:
        timeout = aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout,
                                        sock_connect=self.config.connect_timeout,
                                        sock_read=self.config.stall_timeout)
        tls = trust_context(self.config.registries.ca_file) if self.config.registries.ca_file else True
        self._peer_tls = peer_context(self.config.peers)
        self._session_options = {"auto_decompress": False, "timeout": timeout, "headers": {"User-Agent": "cartonstore"}}
        self._tls = tls
        resolver = GuardedResolver(self.config.policy)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64, ssl=tls, resolver=resolver),
                                              **self._session_options)
        return self

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use HttpClient as an async context manager"
        return self._session

    @property
    def fresh_session(self) -> aiohttp.ClientSession:
        """Like session, but every request on a connection of its own:
        for sending again a request whose kept-alive connection turned out
        closed (the pool may hold more such connections)."""
        assert self._session is not None, "use HttpClient as an async context manager"
        if self._fresh is None:
            connector = aiohttp.TCPConnector(force_close=True, ssl=self._tls,
                                             resolver=GuardedResolver(self.config.policy))
            self._fresh = aiohttp.ClientSession(connector=connector,
                                                **self._session_options)
        return self._fresh

    @property
    def links_session(self) -> aiohttp.ClientSession:
        """The session for URLs a carton names (policy.check_link): its
        resolver refuses the addresses they may not reach, and each request
        it sends (a token realm a 401 names too) is checked as such a URL
        first. Its own connections: none is shared with a caller's URL."""
        assert self._session is not None, "use HttpClient as an async context manager"
        if self._links is None:
            policy = self.config.policy
            resolver = self._links_resolver = GuardedResolver(policy, links=True,
                                                              proxies=proxy_endpoints(self.config))
            checks = aiohttp.TraceConfig()

            async def check(_session: object, _context: object, params: aiohttp.TraceRequestStartParams) -> None:
                policy.check_link(str(params.url))
            checks.on_request_start.append(check)
            connector = aiohttp.TCPConnector(limit=64, ssl=self._tls, resolver=resolver)
            self._links = aiohttp.ClientSession(connector=connector, trace_configs=[checks], **self._session_options)
        return self._links

    @property
    def auth(self) -> ChallengeAnswerer:
        """Answers 401 challenges (registries' Basic and Bearer:
        source_kinds.py); made on the first one, so a fetch that never meets
        one reads no credentials."""
        if self._auth is None:
            if self._make_answerer is None:
                raise FetchError("HTTP 401 Unauthorized, and this client was built with no registry "
                                 "authentication to answer it")
            self._auth = self._make_answerer(self)
        return self._auth

    def authorization(self, url: str, *, push: bool = False, kind: str = "url") -> str | None:
        if kind == "peer":
            return f"Bearer {self.config.peers.token}" if self.config.peers.token else None
        if (hub := self.config.hub.authorization_for(url)) is not None:   # each hop asks: none off the Hub
            return hub
        return self._auth.header_for(url, push=push) if self._auth is not None else None

    async def __aexit__(self, *exc: object) -> None:
        for session in (self._session, self._fresh, self._links):
            if session is not None:
                await session.close()
        self._session = self._fresh = self._links = None

    def route(self, url: str, kind: str) -> dict:
        """How a request for url, a source of this kind, is sent: through
        which proxy (proxies.py), with which TLS context (peers' own)."""
        if kind == "peer":
            return {"ssl": self._peer_tls} if self._peer_tls is not None else {}
        proxy = proxy_for(self.config, url, kind)
        return {"proxy": proxy} if proxy else {}

    @asynccontextmanager
    async def get(self, url: str, *, start: int = 0, end: int | None = None, suffix: int | None = None,
                  encoded: bool = True, kind: str = "url", from_carton: bool = False) -> AsyncIterator[Response]:
        """GET url (following checked redirects). With start/end/suffix a Range
        is asked and identity encoding requested; a 206 whose Content-Range
        does not match is an error, a 200 means the server ignored the Range
        (the caller sees start == 0). ``kind`` is the kind of source (see
        route). ``from_carton``: a carton named url (its LINKS), so url and
        every redirect are held to policy.check_link, by name and by the
        addresses it resolves to (links_session)."""
        assert self._session is not None, "use HttpClient as an async context manager"
        policy = self.config.policy
        check = policy.check_link if from_carton else policy.check
        session = self.links_session if from_carton and not policy.allow_private_links else self._session
        vetting = self._links_resolver if session is self._links else None
        # Peers send stored bytes as they are (sendfile): compressing weights costs more CPU than it saves on a LAN.
        encoded = encoded and kind != "peer"
        headers = {"Accept-Encoding": self.config.accept_encoding if encoded else "identity"}
        ranged = suffix is not None or start > 0 or end is not None
        if suffix is not None:
            headers["Range"] = f"bytes=-{suffix}"
        elif ranged:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        current = check(url)
        answered: tuple[str, str] | None = None   # (url, Authorization) a 401 was answered with
        hops = 0
        while hops <= self.config.policy.max_redirects:
            sent = answered[1] if answered and answered[0] == current else self.authorization(current, kind=kind)
            try:
                route = self.route(current, kind)
                if vetting is not None and "proxy" in route:   # the proxy resolves the name; so does this node
                    await vetting.refuse_before_proxy(current)
                raw = await session.get(current, headers={**headers, "Authorization": sent} if sent else headers,
                                        allow_redirects=False, **route)
            except Exception as e:
                raise translate(e, current) from e
            try:
                if raw.status == 401:
                    code = raw.headers.get("X-Error-Code")
                    if answered is not None and answered[0] == current:
                        raise FetchError(f"{describe(current)}: HTTP 401 Unauthorized: the registry refused the "
                                         f"authorization it asked for", subject=current, status=401, error_code=code)
                    try:
                        answered = (current, await self.auth.answer(session, current,
                                                                    raw.headers.getall("WWW-Authenticate", []),
                                                                    sent=sent))
                    except FetchError as e:   # no challenge this client can answer: the 401 is the answer
                        e.status, e.error_code = 401, code
                        raise
                    continue
                hops += 1
                if raw.status in (301, 302, 303, 307, 308):
                    location = raw.headers.get("Location")
                    if not location:
                        raise FetchError(f"{describe(current)}: redirect without a Location", subject=current)
                    current = check(redirect_target(current, location))
                    continue
                response = self._accept(raw, current, ranged, start, end, suffix)
                response.stall_timeout = self.config.stall_timeout
                yield response
                return
            finally:
                raw.release()
        raise FetchError(f"{describe(url)}: more than {self.config.policy.max_redirects} redirects",
                         subject=url)

    def _accept(self, raw: aiohttp.ClientResponse, url: str, ranged: bool, start: int, end: int | None,
                suffix: int | None) -> Response:
        where = describe(url)
        if raw.status not in (200, 206):
            said = f"{where}: HTTP {raw.status} {raw.reason or ''}".rstrip()
            code = raw.headers.get("X-Error-Code")
            if raw.status in _RETRYABLE_STATUS:
                raise FetchError(said, subject=url, retryable=True, status=raw.status, error_code=code,
                                 retry_after=parse_retry_after(raw.headers.get("Retry-After")))
            if raw.status in (404, 410):
                raise FetchNotFound(said, subject=url, status=raw.status, error_code=code)
            raise FetchError(said, subject=url, status=raw.status, error_code=code)
        encodings = parse_content_encoding(raw.headers.get("Content-Encoding"), url=url)
        length = raw.content_length
        if raw.status == 200:
            total = length if not encodings else None
            return Response(url, 200, raw.headers, 0, length, total, encodings, raw)
        if not ranged:
            raise FetchError(f"{where}: answered 206 Partial Content to a request without Range", subject=url)
        cr = parse_content_range(raw.headers.get("Content-Range"))
        if cr is None:
            raise FetchError(f"{where}: 206 without a valid Content-Range "
                             f"({raw.headers.get('Content-Range')!r})", subject=url)
        first, last, total = cr
        wrong = (last < first or (length is not None and length != last - first + 1)
                 or (suffix is None and first != start) or (suffix is None and end is not None and last != end - 1)
                 or (suffix is not None and total is not None and first != max(0, total - suffix)))
        if wrong:
            asked = f"bytes=-{suffix}" if suffix is not None else f"bytes={start}-{'' if end is None else end - 1}"
            raise FetchError(f"{where}: wrong Content-Range {raw.headers.get('Content-Range')!r} for Range {asked}",
                             subject=url)
        return Response(url, 206, raw.headers, first, last - first + 1, total, encodings, raw)


async def with_retries(config: FetchConfig, attempt_fn: Callable[[int], Awaitable[T]],
                       *, on_retry: Callable[[FetchError, float], None] | None = None) -> T:
    """Run attempt_fn(attempt) until it succeeds, retrying retryable FetchErrors
    with backoff; the last error is raised."""
    attempt = 0
    while True:
        try:
            return await attempt_fn(attempt)
        except FetchError as e:
            if not e.retryable or attempt >= config.retries:
                raise
            delay = backoff_delay(attempt, config, e.retry_after)
            if on_retry:
                on_retry(e, delay)
            await asyncio.sleep(delay)
            attempt += 1
