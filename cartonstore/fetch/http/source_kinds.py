"""The kinds of source a Puller reads, and what answers a registry's 401:
handed to the Puller by whoever builds it (``cartonstore.config.pulling``
builds the standard set), so fetch never imports a kind defined above it.

- a source kind claims the texts of its URL schemes (``http``/``https``: a
  carton URL, puller.py; ``oci``: an OCI reference, ``cartonstore.oci``) and
  adds what one names to the store;
- a challenge answerer answers an HTTP 401 with a ``WWW-Authenticate``
  challenge (registries' Basic and Bearer token auth). A client built
  without one treats a 401 as an error like any other status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from cartonstore.errors import InvalidInput

from .policy import describe


def scheme_of(text: str) -> str | None:
    """The lowercased scheme of a text written SCHEME://..., else None
    (a path, a store name)."""
    scheme, sep, _ = text.partition("://")
    return scheme.lower() if sep else None


@dataclass(frozen=True)
class SourceKind:
    name: str
    schemes: tuple[str, ...]
    """The URL schemes whose texts this kind reads (lowercase)."""
    canonical: Callable[[Any, str], str]
    """``canonical(puller, text)``: the text as this kind writes it, checked
    (InvalidInput naming what is wrong): the key that concurrent adds of one
    carton share, and what its progress shows."""
    add: Callable[[Any, str, str | None, bool], Awaitable[Any]]
    """``await add(puller, ref, name, force)`` -> the store's IngestResult,
    given the canonical ref, once at a time per ref across processes."""
    add_lazily: Callable[[Any, str, str | None, bool], Awaitable[Any]] | None = None
    """The add of ``add --lazy``: the carton committed before the blobs it
    lacks, each recorded with its URL (LINKS) to be fetched when asked for;
    None: ``add`` whatever --lazy says."""

    def claims(self, text: str) -> bool:
        return scheme_of(text) in self.schemes


class ChallengeAnswerer(Protocol):
    def header_for(self, url: str, *, push: bool = False) -> str | None:
        """The Authorization header to send to url, if one is known."""

    async def answer(self, session: Any, url: str, challenges: Iterable[str], *, sent: str | None,
                     push: bool = False, extra_scopes: Iterable[str] = ()) -> str:
        """The Authorization header that answers url's 401 challenges (for a
        push: write access; ``extra_scopes``: more to ask the token for)."""


AnswererFactory = Callable[[Any], ChallengeAnswerer]
"""``factory(http_client)`` makes the answerer of one HttpClient, on the first
challenge it meets (so a fetch that meets none reads no credentials)."""


@dataclass(frozen=True)
class SourceKinds:
    """The kinds one Puller reads, and its challenge answerer if any."""

    kinds: tuple[SourceKind, ...]
    answerer: AnswererFactory | None = None

    def kind_for(self, text: str) -> SourceKind | None:
        return next((kind for kind in self.kinds if kind.claims(text)), None)

    def claimed(self, text: str) -> SourceKind:
        """The kind that reads a text written SCHEME://..., else
        InvalidInput naming the scheme and those read here."""
        kind = self.kind_for(text)
        if kind is None:
            read = ", ".join(scheme for k in self.kinds for scheme in k.schemes) or "none"
            raise InvalidInput(f"scheme '{scheme_of(text)}' is not allowed (the schemes read here: {read}): "
                               f"{describe(text)}", subject=text)
        return kind
