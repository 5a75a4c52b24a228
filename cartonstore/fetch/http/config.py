"""Settings of the fetcher, with the defaults a production node wants."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from .codings import DEFAULT_ACCEPT_ENCODING
from .policy import UrlPolicy


@dataclass(frozen=True)
class RegistryConfig:
    """How OCI registries are reached (the [registries] settings)."""

    # Hosts (host or host:port) that may be reached over plain http when
    # https fails; loopback registries always may, as docker allows.
    insecure: tuple[str, ...] = ()
    ca_file: Path | None = None       # CA certificates trusted besides the system's
    auth_file: Path | None = None     # docker config.json format, read before docker's own
    chunk_size: int = 64 << 20        # blobs larger than this are pushed in chunks of this size
    proxy: str | None = None          # HTTP(S) proxy for registries (and their token servers)
    # upstream authority (host or host:port, lower case) -> mirror endpoints, tried in order for
    # manifests by digest and blobs before the upstream (containerd's hosts.toml "mirrors")
    mirrors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    mirror_down_for: float = 60.0     # a mirror that failed is not asked for this long (a pull is usually done by then)


@dataclass(frozen=True)
class PeerConfig:
    """Other nodes whose stores are asked for a blob before its origin (the [peers] settings)."""

    urls: tuple[str, ...] = ()        # their daemons' TCP listeners, http(s)://HOST:PORT
    token: str = field(default="", repr=False)   # sent as a Bearer token; a daemon with one refuses peers without it
    timeout: float = 2.0              # to connect, and for an answer beyond the wait below
    down_for: float = 30.0            # a peer that failed is not asked for this long
    wait: float = 10.0                # a peer fetching a blob holds a probe this long before "not yet"; in all per blob
    tls_cert: Path | None = None      # client certificate (mTLS) for https peers...
    tls_key: Path | None = None       # ...and its key
    ca_file: Path | None = None       # CA that signed the peers' server certificates


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:   # a port that is no number: no origin matches it
        return ("", "", None)
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


@dataclass(frozen=True)
class HubConfig:
    """How the Hugging Face Hub is reached (the [hf] settings)."""

    endpoint: str = "https://huggingface.co"   # the Hub, or a mirror that speaks its API
    # Sent as a Bearer token to the endpoint only: a redirect to another host (the CDN that serves LFS
    # files by signed URL) goes without it, as huggingface_hub sends it.
    token: str = field(default="", repr=False)

    def serves(self, url: str) -> bool:
        """url is at the endpoint: its scheme, host and port, under its path."""
        prefix = urlsplit(self.endpoint).path.rstrip("/")
        return _origin(url) == _origin(self.endpoint) and (
            urlsplit(url).path == prefix or urlsplit(url).path.startswith(prefix + "/"))

    def authorization_for(self, url: str) -> str | None:
        return f"Bearer {self.token}" if self.token and self.serves(url) else None


@dataclass(frozen=True)
class FetchConfig:
    accept_encoding: str = DEFAULT_ACCEPT_ENCODING
    connect_timeout: float = 10.0
    # No bytes for this long is a stall; there is no limit on a whole transfer.
    stall_timeout: float = 30.0
    retries: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    max_concurrency: int = 8          # blob downloads at once, per process
    # Blobs at least this big are fetched as Range parts... Parts cost a
    # second read of the file to hash it, so they pay off only for a blob
    # big enough to be fetched mostly alone.
    parallel_threshold: int = 1 << 30
    parallel_parts: int = 4           # ...this many at once
    coalesce_gap: int = 1 << 20       # remote zip: merge entry ranges closer than this
    lock_timeout: float = 3600.0      # wait for another process's download of the same blob
    max_blob_size: int | None = None  # refuse decoded blobs larger than this
    mirrors: tuple[str, ...] = ()     # tried after LINKS URLs, as <mirror>/<sha256>
    proxy: str | None = None          # HTTP(S) proxy for origins (carton URLs, LINKS URLs, mirrors)
    no_proxy: tuple[str, ...] = ()    # hosts reached directly whatever the proxies (see proxies.py)
    policy: UrlPolicy = field(default_factory=UrlPolicy)
    registries: RegistryConfig = field(default_factory=RegistryConfig)
    peers: PeerConfig = field(default_factory=PeerConfig)
    hub: HubConfig = field(default_factory=HubConfig)
