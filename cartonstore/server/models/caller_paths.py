"""Paths a caller names to the daemon (a load's source, a lease's model):
whose rights read them (cartonstore.system.callers reads as the caller)."""

from __future__ import annotations

from cartonstore.errors import PermissionDenied
from cartonstore.fetch.puller import is_local_source
from cartonstore.server.tensors.shm_regions import Peer
from cartonstore.system.callers import Credentials


def source_caller(source: str, peer: Peer | None, *, allow_tcp: bool) -> Credentials | None:
    """Whose rights read ``source`` when it is a path on this host: a
    Unix-socket caller's own (what it could not read itself, it cannot load
    or lease); over TCP, where no uid is known (and for a peer not known,
    None), the daemon's, only where ``allow_tcp`` (server.allow_tcp_local_sources)
    says so, PermissionDenied naming that setting otherwise. None for a URL or
    a registry reference, which are not read from this host."""
    if not is_local_source(source):
        return None
    if peer is not None and peer.unix:
        return peer.credentials
    if not allow_tcp:
        raise PermissionDenied(f"cannot read {source!r}: a local source (a path on the daemon's host) is read only "
                               "for callers on the daemon's Unix socket, with their own rights; over TCP it needs "
                               "[server] allow_tcp_local_sources = true (it is then read with the daemon's rights)",
                               subject="server.allow_tcp_local_sources")
    return None
