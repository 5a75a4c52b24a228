"""Peers: other nodes' stores, asked for a blob before its origins.

The order peers are asked in is rendezvous hashing of the digest over the
peer URLs, so every node asks the same peer first for a blob and, across a
fleet, each blob is fetched from its origin once rather than once per node.

A probe is ``HEAD <peer>/v1/blobs/<sha256>`` with this node's id
(``Carton-Node``) and how long it may wait (``Carton-Wait``). The peer says:

  200  it has the blob: it is fetched from there with a GET;
  404  it has not, and is not fetching it: the next peer is asked;
  202  it is fetching it and did not finish within the wait: ask again.

A node holds a probe (up to the wait) while it fetches the blob itself
(until it is staged: a staged blob is served before its carton commits):
from its origin, or still asking its own peers when its id outranks the
asker's for that digest (rendezvous over node ids). Waits only ever go to
a higher rank, so they end, and when several nodes start on one blob at
once exactly one of them (the highest) goes to the origin while the rest
wait for it (a node told a higher one "absent" asks its peers again
before going to its origin). A peer that cannot be reached, times out or answers anything
else is not asked again for ``down_for`` seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from cartonstore.fetch.http.client import HttpClient, translate
from cartonstore.fetch.http.config import PeerConfig
from cartonstore.fetch.http.policy import describe
from cartonstore.system.pass_over import PassOver

log = logging.getLogger("cartonstore.peers")

NODE_HEADER = "Carton-Node"
WAIT_HEADER = "Carton-Wait"
MAX_WAIT = 60.0          # the longest a node holds a probe, whatever the asker says
ASKING, ORIGIN = "asking peers", "fetching from its sources"
FOUND, ABSENT, PENDING = 200, 404, 202


def _score(name: str, digest: str) -> bytes:
    return hashlib.sha256(f"{name}\n{digest}".encode()).digest()


def rendezvous(digest: str, names: Iterable[str]) -> list[str]:
    """``names`` from the highest score for this digest to the lowest."""
    return sorted(names, key=lambda name: _score(name, digest), reverse=True)


def outranks(digest: str, node: str, other: str) -> bool:
    return _score(node, digest) > _score(other, digest)


@dataclass(eq=False)
class Claim:
    """This node is getting a blob: probes for it may wait for ``done``."""

    stage: str = ASKING
    done: asyncio.Event = field(default_factory=asyncio.Event)
    outranked: bool = False    # told a higher-ranked asker "absent" while asking: it may be fetching now
    staged: Path | None = None  # verified, waiting for its carton's commit: served from there meanwhile


def offer(claims: dict[str, Claim], digest: str, path: Path) -> None:
    """A blob claimed in ``claims`` is verified and staged at path: peers
    waiting for it are answered now, and served from there, not when its
    carton commits (a carton's blobs commit together, and two nodes adding
    one carton may each wait on the other for a different blob). Only the
    claim's owner offers it: its staging is what the file's life follows."""
    claim = claims.get(digest)
    if claim is not None:
        claim.staged = path
        claim.done.set()


class PeerSet:
    def __init__(self, config: PeerConfig, client: HttpClient) -> None:
        self.config = config
        self.client = client
        self.node_id = secrets.token_hex(8)
        self.urls = tuple(u.rstrip("/") for u in config.urls)
        self.claims: dict[str, Claim] = {}
        self._down = PassOver(config.down_for)
        self._probes = asyncio.Semaphore(16)   # held probes must not take every pooled connection

    def is_peer_url(self, url: str) -> bool:
        head, _, tail = url.rpartition("/v1/blobs/")
        return len(tail) == 64 and head in self.urls

    def order(self, digest: str) -> list[str]:
        """The peers to ask for digest, in rendezvous order, less those marked down."""
        return [p for p in rendezvous(digest, self.urls) if p not in self._down]

    # -- asking --------------------------------------------------------------------

    @asynccontextmanager
    async def claiming(self, digests: Iterable[str]) -> AsyncIterator[dict[str, Claim]]:
        """Claims on the digests no task of this process claims yet, held
        until the block ends (the blobs committed, or given up on)."""
        mine = {d: Claim() for d in dict.fromkeys(digests) if d not in self.claims}
        self.claims.update(mine)
        try:
            yield mine
        finally:
            for digest, claim in mine.items():
                claim.done.set()
                if self.claims.get(digest) is claim:
                    del self.claims[digest]

    def staged_path(self, digest: str) -> Path | None:
        claim = self.claims.get(digest)
        return claim.staged if claim is not None else None

    async def locate(self, digest: str, claim: Claim | None = None) -> str | None:
        """The URL of the blob at the first peer (in rendezvous order) that
        has it, waiting on those fetching it, peers.wait in all (a peer whose
        own fetch is stuck answers "not yet" for ever); None when none has
        it, and the claim moves on to the origin."""
        deadline: float | None = None   # set by the first "not yet": waiting is what peers.wait bounds
        while True:
            if claim is not None:
                claim.outranked = False
            for peer in self.order(digest):
                url = f"{peer}/v1/blobs/{digest}"
                status, asked = PENDING, False
                while status == PENDING:
                    now = time.monotonic()
                    left = self.config.wait if deadline is None else max(0.0, deadline - now)
                    if asked and left <= 0:
                        log.info("peer %s was still fetching %s after peers.wait (%gs in all): not waited for "
                                 "longer", describe(peer), digest[:12], self.config.wait)
                        break
                    # once the wait is spent, each peer is still asked once, to answer at once: it may have it
                    status, asked = await self._ask(peer, url, left), True
                    if status == PENDING and deadline is None:
                        deadline = now + self.config.wait
                if status == FOUND:
                    return url
            # A higher-ranked node that asked meanwhile was told "absent" and
            # is fetching it now (it may have asked before it claimed, which
            # is when this node asked it): ask again, and wait for it.
            if claim is None or not claim.outranked:
                break
        if claim is not None:
            claim.stage = ORIGIN
        return None

    async def _ask(self, peer: str, url: str, wait: float) -> int:
        """One probe, which the peer may hold ``wait`` seconds."""
        headers = {NODE_HEADER: self.node_id, WAIT_HEADER: f"{wait:.3f}"}
        if auth := self.client.authorization(url, kind="peer"):
            headers["Authorization"] = auth
        limit = wait + self.config.timeout
        timeout = aiohttp.ClientTimeout(total=limit, sock_connect=self.config.timeout)
        started = time.monotonic()
        try:
            async with self._probes, self.client.session.head(url, headers=headers, timeout=timeout,
                                                              allow_redirects=False,
                                                              **self.client.route(url, "peer")) as r:
                status = r.status
        except asyncio.TimeoutError:
            return self.mark_down(peer, f"did not answer within {limit:.3g}s")
        except (aiohttp.ClientError, OSError) as e:
            return self.mark_down(peer, translate(e, peer).message.removeprefix(f"{describe(peer)}: "))
        if status == PENDING and time.monotonic() - started < 0.1:
            await asyncio.sleep(0.1)   # a peer that answers "not yet" at once is not let spin us
        if status in (FOUND, ABSENT, PENDING):
            return status
        why = {401: "refused this node's peers.token",
               403: "refused this node's client certificate (peers.tls_cert)"}.get(status, f"answered HTTP {status}")
        return self.mark_down(peer, why)

    def mark_down(self, peer: str, why: str) -> int:
        if self._down.add(peer):
            log.warning("peer %s: %s; not asked again for %gs", describe(peer), why, self.config.down_for)
        return ABSENT

    # -- answering -------------------------------------------------------------------

    async def answer(self, digest: str, asker: str | None, wait: float, present: Callable[[], bool]) -> int:
        """A probe from another node: FOUND, ABSENT or PENDING (see above)."""
        claim = self.claims.get(digest)
        if present() or (claim is not None and claim.staged is not None):
            return FOUND
        if claim is None or asker is None or asker == self.node_id:
            return ABSENT
        if claim.stage == ASKING and not outranks(digest, self.node_id, asker):
            claim.outranked = True
            return ABSENT   # the asker outranks this node: it goes on, and this node will wait for it
        try:
            await asyncio.wait_for(claim.done.wait(), max(0.0, min(wait, MAX_WAIT)))
        except asyncio.TimeoutError:
            return PENDING
        return FOUND if present() or claim.staged is not None else ABSENT
