"""The Hub's API as far as ``hf://`` needs it: a revision's listing, the
URLs of its files, and the Hub's own name for a refusal.

Requests go through the fetch client (URL policy, proxies, retries); the
token (fetch.hub) goes to the endpoint only, never to the CDN a file is
redirected to. The Hub names why it refuses in ``X-Error-Code``
(``GatedRepo``, ``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``),
as huggingface_hub reads it; a failed request is asked once more, for that
header, and the error raised says it in words.
"""

from __future__ import annotations

import asyncio

from cartonstore.errors import CartonStoreError, FetchError, NotFound, PermissionDenied
from cartonstore.fetch.http.client import HttpClient, with_retries
from cartonstore.fetch.http.policy import describe

from .listing import MAX_LISTING_SIZE, Revision, parse_revision
from .reference import HubReference, api_path, resolve_path


class Hub:
    """The endpoint fetch.hub names, over one HttpClient."""

    def __init__(self, client: HttpClient) -> None:
        self.client = client
        self.endpoint = client.config.hub.endpoint.rstrip("/")

    def resolve_url(self, repo: str, commit: str, path: str) -> str:
        return self.endpoint + resolve_path(repo, commit, path)

    async def revision(self, ref: HubReference) -> Revision:
        """The commit ref's revision names and its files; NotFound,
        PermissionDenied or FetchError saying why not."""
        url = self.endpoint + api_path(ref.repo, ref.revision)
        try:
            raw = await with_retries(self.client.config, lambda _n: self._read(url))
        except FetchError as e:
            raise self.refusal(url, ref, e) from None
        return await asyncio.to_thread(parse_revision, raw, ref)   # up to MAX_LISTING_SIZE of JSON

    async def _read(self, url: str) -> bytes:
        parts, size = [], 0
        async with self.client.get(url, encoded=False) as response:
            async for chunk in response.chunks():
                size += len(chunk)
                if size > MAX_LISTING_SIZE:
                    raise FetchError(f"{describe(url)}: a listing longer than {MAX_LISTING_SIZE} bytes", subject=url)
                parts.append(chunk)
        return b"".join(parts)

    def refusal(self, url: str, ref: HubReference, error: FetchError, *,
                file: str | None = None) -> CartonStoreError:
        """The Hub's refusal of url named by the status and X-Error-Code it
        answered (hub_error); else ``error`` as it came (a network failure,
        a server error after the retries)."""
        if error.retryable or error.status is None:
            return error
        named = hub_error(error.status, error.error_code, ref, self.endpoint,
                          token=self.client.authorization(url) is not None, file=file)
        return named or error


def hub_error(status: int, code: str | None, ref: HubReference, endpoint: str, *, token: bool,
              file: str | None = None) -> CartonStoreError | None:
    """The Hub's refusal in words, or None when it is none of those it names (pure)."""
    no_token = "" if token else " (no token is set: HF_TOKEN or [hf] token_file)"
    repo = ref.repo
    if code == "GatedRepo":
        return PermissionDenied(f"{repo} is a gated repository: accept the license at {endpoint}/{repo}, with the "
                                f"account whose token cartonstore sends{no_token}", subject=str(ref))
    if code == "RepoNotFound":
        return NotFound(f"{repo}: no such repository at {endpoint}, or a private one this token cannot read"
                        f"{no_token}", subject=str(ref))
    if code == "RevisionNotFound":
        return NotFound(f"{repo}: no revision {ref.revision!r} at {endpoint}", subject=str(ref))
    if code == "EntryNotFound":
        return NotFound(f"{repo}@{ref.revision}: the Hub has no file {file!r}", subject=str(ref))
    if status == 401:
        said = "refused the token cartonstore sends" if token else "needs a token: set HF_TOKEN or [hf] token_file"
        return PermissionDenied(f"{repo}: {endpoint} answered 401 Unauthorized: it {said}", subject=str(ref))
    if status == 403:
        return PermissionDenied(f"{repo}: {endpoint} answered 403 Forbidden: the token cartonstore sends may not "
                                f"read this repository", subject=str(ref))
    return None
