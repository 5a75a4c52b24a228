"""[peers]: other nodes asked for blobs before origins (read by cartonstore.config).

    [peers]
    urls = ["http://10.0.0.2:7070", "http://10.0.0.3:7070"]   # their [server] listen
    token_file = "/etc/cartonstore/peer-token"                # the same on every node
    timeout = "2s"
    down_for = "30s"
    wait = "10s"
    # mTLS instead of (or besides) the token, with [server] tls_* on every node:
    # urls = ["https://node2:7070"]; tls_cert, tls_key, ca_file
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cartonstore.fetch.http.config import PeerConfig

from . import values as v

_DEFAULTS = PeerConfig()


def _check_urls(urls: tuple[str, ...]) -> None:
    for url in urls:
        v.url_prefix(url, what="a peer is the URL of another node's daemon (http(s)://HOST:PORT, its blobs are "
                               "<peer>/v1/blobs/<sha256>)", path=False)


@dataclass(frozen=True)
class PeerSettings:
    """[peers]"""

    urls: tuple[str, ...] = v.setting(_DEFAULTS.urls, v.strings(_check_urls))
    # The shared secret peers send (and this node's /v1/blobs requires over TCP). Prefer token_file.
    token: str = v.token_setting()
    token_file: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()
    timeout: float = v.duration_setting(_DEFAULTS.timeout, positive=True)
    down_for: float = v.duration_setting(_DEFAULTS.down_for, positive=False)
    wait: float = v.duration_setting(_DEFAULTS.wait, positive=False)
    tls_cert: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()
    tls_key: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()
    ca_file: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()

    def peer_config(self) -> PeerConfig:
        token = v.read_token(self.token_file, "peers.token_file") if self.token_file is not None else self.token
        return PeerConfig(tuple(u.rstrip("/") for u in self.urls), token, self.timeout, self.down_for, self.wait,
                          self.tls_cert, self.tls_key, self.ca_file)
