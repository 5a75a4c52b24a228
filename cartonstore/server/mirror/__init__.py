"""The daemon's door for container runtimes: the pull side of the OCI
distribution API on [mirror] listen, answered by oci/pull_through.py.
Entry point: ``MirrorServer`` (server.py)."""

from .server import MirrorServer

__all__ = ["MirrorServer"]
