"""Answering registry challenges: anonymous, Basic, and Bearer tokens.

A request goes out with what this registry asked for before (a cached
token for the repository's scope, or Basic credentials); a 401 is answered
once, as docker answers it:

- ``Basic``: the registry's credentials (credentials.py), or an error
  saying none were found.
- ``Bearer realm=...,service=...,scope=...``: a token from the realm, asked
  for the repository's scope (pull, or pull,push to push), with Basic
  credentials when there are some (anonymous otherwise), or an identity
  token traded by OAuth2 refresh_token grant. Tokens are cached per
  registry and scope until shortly before they expire.

Authorization is only ever sent to the authority (host:port) that asked
for it: a blob redirected to a storage host goes there without it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import aiohttp

from cartonstore.errors import FetchError
from cartonstore.fetch.http.policy import describe
from cartonstore.system.single_flight import SingleFlight

from .challenge import Challenge, parse_challenges
from .credentials import Credentials, find_credentials

_REPOSITORY_PATH = re.compile(r"^/v2/(.+?)/(?:blobs|manifests|tags)/")
TOKEN_MARGIN = 10.0       # renew a token this long before it expires
DEFAULT_TOKEN_LIFE = 60.0  # what the token spec says to assume without expires_in


def authority_of(url: str) -> str:
    rest = url.split("://", 1)[-1]
    authority = rest.split("/", 1)[0].rsplit("@", 1)[-1].lower()
    if url.startswith("https://") and authority.endswith(":443"):
        return authority[:-4]
    if url.startswith("http://") and authority.endswith(":80"):
        return authority[:-3]
    return authority


def repository_of(url: str) -> str | None:
    path = "/" + url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
    m = _REPOSITORY_PATH.match(path)
    return m.group(1) if m else None


def scope_for(url: str, push: bool) -> str | None:
    repo = repository_of(url)
    return f"repository:{repo}:{'pull,push' if push else 'pull'}" if repo else None


class RegistryAuth:
    def __init__(self, credential_files: list[Path], *, check_url: Callable[[str], str] = lambda u: u,
                 route: Callable[[str], dict] = lambda _u: {}) -> None:
        """``check_url`` vets a token realm before it is asked (the fetch URL
        policy); ``route(url)`` gives the request's options (its proxy)."""
        self.credential_files = credential_files
        self.check_url = check_url
        self.route = route
        self._credentials: dict[str, Credentials | None] = {}
        self._tokens: dict[tuple[str, str], tuple[str, float]] = {}
        self._basic: set[str] = set()        # authorities that asked for Basic
        self._flights = SingleFlight()

    async def credentials(self, authority: str) -> Credentials | None:
        """Read in a thread (files, and perhaps a credential helper process), once."""
        if authority not in self._credentials:
            self._credentials[authority] = await asyncio.to_thread(find_credentials, authority,
                                                                   self.credential_files)
        return self._credentials[authority]

    def header_for(self, url: str, *, push: bool = False) -> str | None:
        """The Authorization value to send with a request to url, if any is known."""
        authority = authority_of(url)
        if authority in self._basic:   # answer() read its credentials
            creds = self._credentials.get(authority)
            return _basic(creds) if creds and creds.username else None
        for scope in _scopes_covering(scope_for(url, push)):
            token = self._tokens.get((authority, scope))
            if token is not None and token[1] > time.monotonic():
                return token[0]
        return None

    async def answer(self, session: aiohttp.ClientSession, url: str, challenges: Iterable[str], *,
                     push: bool = False, sent: str | None = None, extra_scopes: Iterable[str] = ()) -> str:
        """A 401 came for url (with ``sent`` as its Authorization): the
        Authorization to try again with. FetchError says why there is none."""
        where = describe(url)
        authority = authority_of(url)
        parsed = [c for header in challenges for c in parse_challenges(header)]
        bearer = next((c for c in parsed if c.scheme == "bearer" and c.realm), None)
        if bearer is not None:
            scopes = [s for s in (scope_for(url, push) or bearer.params.get("scope"), *extra_scopes) if s]
            key = " ".join(scopes)
            header = self.header_for(url, push=push)
            if header is not None and header != sent:   # another request got a token meanwhile
                return header
            return await self._flights.run(f"{authority}\n{key}", lambda: self._token(session, authority, bearer,
                                                                                        scopes, where))
        if any(c.scheme == "basic" for c in parsed):
            creds = await self.credentials(authority)
            if creds is None or not creds.username:
                raise FetchError(f"{where}: HTTP 401: the registry asks for a user and password, and none is "
                                 f"configured for {authority} ({self._looked_in()})", subject=url)
            if authority in self._basic and sent is not None:
                raise FetchError(f"{where}: HTTP 401: the registry refused the credentials for {authority} "
                                 f"(user {creds.username!r})", subject=url)
            self._basic.add(authority)
            return _basic(creds)
        shown = "; ".join(challenges)[:200] or "none"
        raise FetchError(f"{where}: HTTP 401 Unauthorized without a usable challenge (WWW-Authenticate: {shown})",
                         subject=url)

    def _looked_in(self) -> str:
        return "looked in " + ", ".join(str(p) for p in self.credential_files)

    async def _token(self, session: aiohttp.ClientSession, authority: str, challenge: Challenge,
                     scopes: list[str], where: str) -> str:
        realm = self.check_url(challenge.realm or "")
        creds = await self.credentials(authority)
        params = [("service", challenge.params["service"])] if "service" in challenge.params else []
        params += [("scope", s) for s in scopes]
        headers = {}
        if creds is not None and creds.identity_token:
            form = dict(params, grant_type="refresh_token", refresh_token=creds.identity_token,
                        client_id="cartonstore")
            form["scope"] = " ".join(scopes)
            call = lambda: session.post(realm, data=form, allow_redirects=False, **self.route(realm))  # noqa: E731 - one name for either request, sent by the retry below
        else:
            if creds is not None and creds.username:
                headers["Authorization"] = _basic(creds)
            call = lambda: session.get(realm, params=params, headers=headers,  # noqa: E731 - one name for either request, sent by the retry below
                                       allow_redirects=False, **self.route(realm))
        for attempt in range(2):
            try:
                async with call() as r:
                    body = await r.read()
                    status = r.status
                break
            except Exception as e:  # translated here, once
                from cartonstore.fetch.http.client import translate

                # A kept-alive connection closed unannounced (see Registry._send): asked again, once.
                if attempt or not isinstance(e, aiohttp.ServerDisconnectedError):
                    raise translate(e, realm) from e
        if status != 200:
            who = f"as {creds.username!r}" if creds is not None and creds.username else "anonymously"
            raise FetchError(f"{where}: the token service {describe(realm)} refused a token {who} for "
                             f"{' '.join(scopes) or 'this registry'} (HTTP {status})", subject=realm,
                             retryable=status >= 500)
        try:
            doc = json.loads(body)
            token = doc.get("token") or doc.get("access_token")
            life = float(doc.get("expires_in") or DEFAULT_TOKEN_LIFE)
        except (ValueError, AttributeError, TypeError):
            token, life = None, 0.0
        if not isinstance(token, str) or not token:
            raise FetchError(f"{where}: the token service {describe(realm)} answered without a token", subject=realm)
        header = f"Bearer {token}"
        if scopes:  # the request's own scope first: header_for looks tokens up by it
            self._tokens[(authority, scopes[0])] = (header, time.monotonic() + max(1.0, life - TOKEN_MARGIN))
        return header


def _basic(creds: Credentials) -> str:
    return "Basic " + base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()


def _scopes_covering(scope: str | None) -> list[str]:
    """The cached scopes whose token serves a request needing ``scope``:
    itself, and for a pull the pull,push one."""
    if scope is None:
        return []
    if scope.endswith(":pull"):
        return [scope, scope + ",push"]
    return [scope]
