"""Who may call what over TCP. Callers on the Unix socket are let in by its
mode and group (server.socket_mode, socket_group) and asked for nothing.

Over TCP every route but /v2/health/* needs a credential, once one is
configured:

- ``server.token`` (Bearer): every route;
- ``peers.token`` (Bearer), or a client certificate that
  ``server.tls_client_ca`` signed: /v1/blobs alone, so that a peer (every
  node of a fleet holds such a certificate) can never load code on its
  neighbours (403 elsewhere).

/v1/blobs keeps its own rules: with tls_client_ca it takes only callers
with a certificate (403), with a token configured only the peer token or
server.token (401). With no credential configured at all, TCP is open:
the daemon starts so only on a loopback listener (the quick start), and
then every local user may load code (docs/http-api.md). With only
tls_client_ca, every route but /v1/blobs is closed over TCP.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from cartonstore.errors import PermissionDenied, Unauthenticated

OPEN_PREFIX = "/v2/health/"
BLOBS_PREFIX = "/v1/blobs/"
REALM = 'Bearer realm="cartonstore"'


@dataclass(frozen=True)
class TcpAccess:
    token: str = ""          # server.token
    peer_token: str = ""     # peers.token
    client_ca: bool = False  # server.tls_client_ca: certificates it signed are asked for

    @property
    def has_credential(self) -> bool:
        """TCP callers must show something: TCP is not open to anyone."""
        return bool(self.token) or self.client_ca

    def check(self, path: str, authorization: str | None, has_certificate: bool) -> None:
        """Raise Unauthenticated (401) or PermissionDenied (403) unless a TCP
        caller sending ``authorization`` may call ``path``."""
        if path.startswith(OPEN_PREFIX):
            return
        # surrogateescape: aiohttp keeps a header's undecodable bytes as surrogates (a wrong token, not a 500)
        sent = (authorization or "").encode("utf-8", "surrogateescape")
        if path.startswith(BLOBS_PREFIX):
            if self.client_ca and not has_certificate:
                raise PermissionDenied("/v1/blobs over TCP takes only clients with a certificate signed by "
                                       "server.tls_client_ca")
            tokens = [t for t in (self.peer_token, self.token) if t]
            if tokens and not any(_is(sent, t) for t in tokens):
                raise Unauthenticated("/v1/blobs over TCP needs this fleet's peer token (peers.token) as a Bearer "
                                      "token" + (": the one sent is not it" if sent else ""))
            return
        if not self.has_credential:
            return   # loopback only: the daemon refuses to start otherwise
        if self.token and _is(sent, self.token):
            return
        if self.peer_token and _is(sent, self.peer_token):
            raise PermissionDenied(f"the peer token (peers.token) authorizes /v1/blobs only, not {path}")
        if not self.token and has_certificate:
            raise PermissionDenied(f"a client certificate (server.tls_client_ca) authorizes /v1/blobs only, not "
                                   f"{path}: the API over TCP needs server.token")
        raise Unauthenticated(f"{path} over TCP needs server.token as a Bearer token"
                              + (": the token sent is not it" if sent else ""))


def check_mirror(access: TcpAccess, authorization: str | None) -> None:
    """The registry mirror's rule: server.token as a Bearer token when one
    is set (the peer token and client certificates authorize /v1/blobs only)."""
    sent = (authorization or "").encode("utf-8", "surrogateescape")
    if access.token and not _is(sent, access.token):
        raise Unauthenticated("the registry mirror over TCP needs server.token as a Bearer token"
                              + (": the token sent is not it" if sent else ""))


def _is(sent: bytes, token: str) -> bool:
    """In constant time: a wrong token's length and bytes tell nothing."""
    return hmac.compare_digest(sent, f"Bearer {token}".encode())
