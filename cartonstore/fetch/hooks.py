"""Where layers above fetch plug in, so that fetch never imports them.

Two hooks, each set by the package that provides it (``cartonstore.oci``
sets both when it is imported, and whatever builds a Puller for a user, the
CLI and the daemon, imports it):

- source kinds: references that are neither a URL nor a local path (an OCI
  reference, ``oci://registry.example.com/team/model:v1``). The Puller asks each
  registered kind whether it claims a text before it tries a URL or a path,
  and hands a claimed one to the kind's ``add``;
- the challenge answerer: what answers an HTTP 401 with a
  ``WWW-Authenticate`` challenge (registries' Basic and Bearer token auth).
  Without one, a 401 is an error like any other status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class SourceKind:
    name: str
    claims: Callable[[str], bool]
    """Whether a text names a carton of this kind (checked before URLs and paths)."""
    canonical: Callable[[str], str]
    """The claimed text as this kind writes it: the key that concurrent adds
    of one carton share, and what progress shows."""
    add: Callable[[Any, str, str | None, bool], Awaitable[Any]]
    """``await add(puller, text, name, force)`` -> the store's IngestResult."""


class ChallengeAnswerer(Protocol):
    def header_for(self, url: str, *, push: bool = False) -> str | None:
        """The Authorization header to send to url, if one is known."""

    async def answer(self, session: Any, url: str, challenges: Iterable[str], *, sent: str | None,
                     push: bool = False, extra_scopes: Iterable[str] = ()) -> str:
        """The Authorization header that answers url's 401 challenges."""


_source_kinds: dict[str, SourceKind] = {}
_answerer_factory: Callable[[Any], ChallengeAnswerer] | None = None


def register_source_kind(kind: SourceKind) -> None:
    """Add (or replace, by name) a source kind."""
    _source_kinds[kind.name] = kind


def source_kind_for(text: str) -> SourceKind | None:
    """The registered kind that claims text, if any."""
    return next((kind for kind in _source_kinds.values() if kind.claims(text)), None)


def register_challenge_answerer(factory: Callable[[Any], ChallengeAnswerer]) -> None:
    """``factory(http_client)`` makes the answerer of one HttpClient, on the
    first challenge it meets."""
    global _answerer_factory
    _answerer_factory = factory


def challenge_answerer_for(client: Any) -> ChallengeAnswerer | None:
    return _answerer_factory(client) if _answerer_factory is not None else None
