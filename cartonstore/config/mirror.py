"""[mirror]: the node's pull-through OCI registry mirror (off by default;
oci/pull_through.py, server/mirror/). Beyond loopback it needs
server.allow_remote_listen and server.token, which callers send as a
Bearer token.

    [mirror]
    listen = "127.0.0.1:5050"     # "" (off) or HOST:PORT
    upstream = "registry.example:5000"   # the registry asked when a request has no ?ns=
    tag_ttl = "30s"               # how long a tag's manifest is answered without asking upstream
"""

from __future__ import annotations

from dataclasses import dataclass

from . import values as v
from .server import _listen, _split_listen


def _authority(value: object) -> str:
    if not isinstance(value, str) or any(c in value for c in "/ ?#@"):
        raise v.BadValue(f"expected a registry's HOST[:PORT], got {value!r}")
    return value


@dataclass(frozen=True)
class MirrorSettings:
    """[mirror]"""

    listen: str = v.setting("", _listen)
    upstream: str = v.setting("", _authority)
    tag_ttl: float = v.duration_setting(30.0, positive=False)

    @property
    def listen_address(self) -> tuple[str, int] | None:
        return _split_listen(self.listen) if self.listen else None
