"""The OCI distribution API, as far as cartons need it.

Manifests are fetched and pushed, blobs checked (HEAD), mounted from another
repository, and uploaded (upload.py); blob downloads go through the fetch
path (fetch/http/client.py, fetch/transfer/download.py), which answers the same challenges
through the same RegistryAuth.

The scheme: https always; plain http too, for a registry on loopback
(127.0.0.0/8, ::1, localhost) or listed in ``registries.insecure``, when
https cannot be reached there (docker's rule). A certificate is always
verified when https answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from cartonstore.errors import CartonStoreError, FetchError, FetchNotFound, IntegrityError
from cartonstore.fetch.http.client import HttpClient, translate, with_retries
from cartonstore.fetch.http.policy import describe, redirect_target
from cartonstore.fetch.sources.mirrors import pass_over_mirror
from cartonstore.fetch.sources.registry_mirrors import mirror_url
from cartonstore.system.hosts import is_loopback
from cartonstore.system.pass_over import PassOver

from .artifact import ACCEPT, MAX_MANIFEST_SIZE, OCI_MANIFEST
from .reference import OciReference

if TYPE_CHECKING:
    from cartonstore.fetch.http.config import FetchConfig

log = logging.getLogger("cartonstore.oci")

@dataclass(frozen=True)
class Answer:
    status: int
    headers: Any          # CIMultiDictProxy
    body: bytes
    url: str


class Registry:
    """One repository of one registry, over a shared HttpClient."""

    def __init__(self, client: HttpClient, ref: OciReference, passed_over: PassOver | None = None) -> None:
        self.client = client
        self.ref = ref
        self.base: str | None = None   # "https://host:port", found by connect()
        self._connecting = asyncio.Lock()   # blobs staged at once after a mirror's manifest probe it once
        # mirrors not asked again for a while: the node's (the puller's fetcher's), so each pull and each
        # blob fetched again does not wait out a dead mirror's timeout on its own
        self.passed_over = passed_over if passed_over is not None else PassOver(
            client.config.registries.mirror_down_for)

    @property
    def config(self) -> FetchConfig:
        return self.client.config

    def url(self, path: str) -> str:
        assert self.base is not None, "call connect() first"
        return f"{self.base}/v2/{self.ref.repository}/{path}"

    def blob_url(self, digest: str) -> str:
        return self.url(f"blobs/sha256:{digest}")

    @property
    def mirrors(self) -> tuple[str, ...]:
        """The endpoints [registries.mirrors] lists for this registry, in
        order, less those passed over lately."""
        # by host:port as written in the reference, as containerd keys them
        listed = self.config.registries.mirrors.get(self.ref.authority.lower(), ())
        return tuple(m for m in listed if m not in self.passed_over)

    def pass_over(self, endpoint: str, why: str) -> None:
        """Ask ``endpoint`` nothing more for a while (fetch/sources/mirrors.py): it
        failed otherwise than by not having what was asked."""
        pass_over_mirror(self.passed_over, endpoint, self.ref.authority, why)

    def mirror_url(self, endpoint: str, path: str) -> str:
        """``path`` of this repository at a mirror, naming the registry it
        mirrors as containerd does (the ``ns`` query parameter)."""
        return mirror_url(endpoint, self.ref.repository, self.ref.authority, path)

    def source_url(self, digest: str) -> str:
        """The blob at the registry, as recorded for fetching it again: the
        registry's own URL, never a mirror's (mirrors are the config's of the
        day, and node-local); when the registry did not answer, the scheme
        it most likely has (plain http for loopback and insecure ones)."""
        base = self.base or f"{'http' if self._plain_ok() else 'https'}://{self.ref.authority}"
        return f"{base}/v2/{self.ref.repository}/blobs/sha256:{digest}"

    async def connect(self) -> str:
        """Find the scheme the registry answers on (GET /v2/); returns the base URL."""
        if self.base is not None:
            return self.base
        async with self._connecting:
            if self.base is None:
                self.base = await self._probe()
            return self.base

    async def _probe(self) -> str:
        """GET /v2/ over https (and plain http where allowed): the base URL that answers."""
        authority = self.ref.authority
        plain_ok = self._plain_ok()
        problems = []
        for scheme in ("https", "http") if plain_ok else ("https",):
            base = f"{scheme}://{authority}"
            try:
                answer = await self.request("GET", f"{base}/v2/", authorize=False)
            except FetchError as e:
                problems.append(f"{scheme}: {e.message}")
                continue
            if answer.status in (200, 401):
                return base
            problems.append(f"{scheme}: GET /v2/ answered HTTP {answer.status}, not an OCI registry")
        hint = "" if plain_ok else " (plain http is tried only for hosts in registries.insecure)"
        raise FetchError(f"cannot reach the registry {authority}{hint}: " + "; ".join(problems),
                         subject=str(self.ref), retryable=True)

    def _plain_ok(self) -> bool:
        """Plain http may be tried: a loopback registry, or one in registries.insecure."""
        insecure = self.config.registries.insecure
        return is_loopback(self.ref.host) or self.ref.authority.lower() in insecure \
            or self.ref.host.lower() in insecure

    async def request(self, method: str, url: str, *, push: bool = False, headers: dict | None = None,
                      body: Callable[[], Any] | None = None, limit: int = 1 << 20, authorize: bool = True,
                      extra_scopes: tuple[str, ...] = ()) -> Answer:
        """One API call, its 401 answered once; ``body()`` makes the request
        body afresh (a retry after a 401 sends it again). Bodies over
        ``limit`` are an error. Redirects are not followed (the API's own
        answers are 201/202 with a Location)."""
        url = self.config.policy.check(url)
        sent = self.client.authorization(url, push=push) if authorize else None
        answer = await self._send(method, url, headers, body, limit, sent)
        if answer.status == 401 and authorize:
            challenges = answer.headers.getall("WWW-Authenticate", [])
            sent = await self.client.auth.answer(self.client.session, url, challenges,
                                                 push=push, sent=sent, extra_scopes=extra_scopes)
            answer = await self._send(method, url, headers, body, limit, sent)
            if answer.status == 401:
                raise FetchError(f"{method} {describe(url)}: HTTP 401 Unauthorized: the registry refused the "
                                 f"authorization it asked for", subject=url)
        return answer

    async def _send(self, method: str, url: str, headers: dict | None, body: Callable[[], Any] | None, limit: int,
                    authorization: str | None) -> Answer:
        call_headers = {**(headers or {}), **({"Authorization": authorization} if authorization else {})}
        for attempt in range(2):
            session = self.client.session if attempt == 0 else self.client.fresh_session
            try:
                async with session.request(method, url, headers=call_headers,
                                           data=body() if body else None, allow_redirects=False,
                                           **self.client.route(url, "registry")) as r:
                    return Answer(r.status, r.headers, await _read_limited(r, limit, url), url)
            except FetchError:
                raise
            except aiohttp.ServerDisconnectedError as e:
                # A kept-alive connection the server (or a proxy: tinyproxy does) closed after its last
                # answer without saying so: nothing was answered, so the request is sent again, once, on a
                # new connection (the pool may hold several such: concurrent uploads each left one).
                if attempt:
                    raise translate(e, url) from e
            except Exception as e:  # translated here, once
                raise translate(e, url) from e
        raise AssertionError("unreachable")

    def location(self, answer: Answer) -> str:
        """The Location of a 201/202, absolute, and allowed by the URL policy."""
        where = answer.headers.get("Location")
        if not where:
            raise FetchError(f"{describe(answer.url)}: HTTP {answer.status} without a Location", subject=answer.url)
        return self.config.policy.check(redirect_target(answer.url, where))

    async def get_manifest(self) -> tuple[bytes, str, str]:
        """The manifest's bytes, media type and digest ("sha256:..."), checked:
        by digest when the reference names one, and against the digest the
        registry says it served. By digest, each mirror is asked first, and
        the registry only when none has it (a tag is resolved at the registry)."""
        if self.ref.digest:
            for endpoint in self.mirrors:
                found = await self._manifest_from_mirror(endpoint)
                if found is not None:
                    return found   # the registry is asked only if a blob needs it (pull.py)
        await self.connect()
        url = self.url(f"manifests/{self.ref.reference}")

        async def attempt(_n: int) -> Answer:
            answer = await self.request("GET", url, headers={"Accept": ACCEPT}, limit=MAX_MANIFEST_SIZE)
            if answer.status in (404, 410):
                raise FetchNotFound(f"{self.ref}: the registry has no such manifest (HTTP {answer.status})",
                                    subject=str(self.ref))
            if answer.status >= 500 or answer.status in (408, 429):
                raise FetchError(f"{self.ref}: the registry answered HTTP {answer.status}", subject=str(self.ref),
                                 retryable=True)
            if answer.status != 200:
                raise FetchError(f"{self.ref}: the registry answered HTTP {answer.status} for the manifest",
                                 subject=str(self.ref))
            return answer

        answer = await with_retries(self.config, attempt)
        digest = "sha256:" + hashlib.sha256(answer.body).hexdigest()
        said = answer.headers.get("Docker-Content-Digest")
        if self.ref.digest and digest != self.ref.digest:
            raise IntegrityError(f"{self.ref}: the manifest served hashes to {digest}, not the digest asked for",
                                 subject=str(self.ref))
        if said and said.startswith("sha256:") and said != digest:
            raise IntegrityError(f"{self.ref}: the registry says the manifest is {said}, its bytes hash to {digest}",
                                 subject=str(self.ref))
        return answer.body, _media_type(answer), digest

    async def _manifest_from_mirror(self, endpoint: str) -> tuple[bytes, str, str] | None:
        """The manifest by digest from one mirror, checked; None (logged) when
        it has not got it, cannot be reached, or serves other bytes."""
        url = self.mirror_url(endpoint, f"manifests/{self.ref.digest}")
        try:
            answer = await self.request("GET", url, headers={"Accept": ACCEPT}, limit=MAX_MANIFEST_SIZE)
        except CartonStoreError as e:   # unreachable, or a host fetch.allow_hosts/deny_hosts refuses
            self.pass_over(endpoint, e.message)
            return None
        digest = "sha256:" + hashlib.sha256(answer.body).hexdigest()
        if answer.status in (404, 410):
            log.info("mirror %s answered HTTP %s; asking the next", describe(url), answer.status)
            return None
        if answer.status != 200 or digest != self.ref.digest:
            self.pass_over(endpoint, f"answered HTTP {answer.status}" if answer.status != 200
                           else f"served a manifest that hashes to {digest}, not {self.ref.digest}")
            return None
        return answer.body, _media_type(answer), digest

    async def put_manifest(self, tag: str, raw: bytes) -> str:
        """Push the manifest under tag; returns its digest."""
        await self.connect()
        answer = await self.request("PUT", self.url(f"manifests/{tag}"), push=True,
                                    headers={"Content-Type": OCI_MANIFEST}, body=lambda: raw)
        if answer.status not in (200, 201):
            raise FetchError(f"{self.ref}: the registry refused the manifest (HTTP {answer.status}: "
                             f"{said_by_registry(answer)})", subject=str(self.ref))
        return "sha256:" + hashlib.sha256(raw).hexdigest()

    async def blob_size(self, digest: str, *, push: bool = True) -> int | None:
        """HEAD a blob: its size if the repository has it, else None
        (``push``: asked with the push scope, as before an upload)."""
        answer = await self.request("HEAD", self.blob_url(digest), push=push)
        if answer.status == 200:
            length = answer.headers.get("Content-Length") or "0"
            if not length.isdigit():
                raise FetchError(f"HEAD {describe(answer.url)}: Content-Length {length[:40]!r} is not a size",
                                 subject=answer.url)
            return int(length)
        if answer.status == 404:
            return None
        raise FetchError(f"HEAD {describe(answer.url)}: HTTP {answer.status}", subject=answer.url,
                         retryable=answer.status >= 500)

    async def start_upload(self, mount: tuple[str, str] | None = None) -> str | None:
        """POST an upload; with ``mount`` (digest, from repository) ask to mount
        that blob instead. None when the mount was done (201), else the
        upload's Location."""
        params = f"?mount=sha256:{mount[0]}&from={mount[1]}" if mount else ""
        extra = (f"repository:{mount[1]}:pull",) if mount else ()
        answer = await self.request("POST", self.url(f"blobs/uploads/{params}"), push=True,
                                    headers={"Content-Length": "0"}, extra_scopes=extra)
        if answer.status == 201 and mount:
            return None
        if answer.status != 202:
            raise FetchError(f"POST {describe(answer.url)}: the registry did not start an upload (HTTP "
                             f"{answer.status}: {said_by_registry(answer)})", subject=answer.url,
                             retryable=answer.status >= 500)
        return self.location(answer)


def _media_type(answer: Answer) -> str:
    return answer.headers.get("Content-Type", "").split(";")[0].strip()


async def _read_limited(r: Any, limit: int, url: str) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in r.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise FetchError(f"{describe(url)}: answer longer than the {limit} bytes expected", subject=url)
        parts.append(chunk)
    return b"".join(parts)


def said_by_registry(answer: Answer) -> str:
    """The registry's own error, from its JSON errors body, in a few words."""
    try:
        errors = json.loads(answer.body).get("errors") or []
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)[:300] or "no detail"
    except (ValueError, AttributeError, TypeError):   # not JSON, or not the errors shape
        return answer.body[:200].decode(errors="replace") or "no detail"


async def iter_file(path: str, start: int, length: int, piece: int = 1 << 20) -> AsyncIterator[bytes]:
    """length bytes of a file from start, read in worker threads."""
    f = await asyncio.to_thread(open, path, "rb")
    try:
        await asyncio.to_thread(f.seek, start)
        left = length
        while left > 0:
            data = await asyncio.to_thread(f.read, min(piece, left))
            if not data:
                raise FetchError(f"{path}: ended {left} bytes early while uploading", subject=path)
            left -= len(data)
            yield data
    finally:
        await asyncio.to_thread(f.close)
