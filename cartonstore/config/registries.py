"""[registries]: how OCI registries are reached (read by cartonstore.config).

    [registries]
    insecure = ["registry.lab:5000"]   # plain http allowed (loopback always is)
    ca_file = "/etc/cartonstore/registry-ca.pem"
    auth_file = "/etc/cartonstore/registry-auth.json"
    chunk_size = "64MiB"
    proxy = "http://proxy.lab:3128"    # "" for none; fetch.no_proxy applies

    mirror_down_for = "60s"            # a mirror that failed is not asked for this long
    [registries.mirrors."registry.example.com"]
    endpoints = ["http://127.0.0.1:30020", "https://cache.lab"]   # tried in order, the upstream last
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

from cartonstore.errors import InvalidInput
from cartonstore.fetch.http.config import RegistryConfig
from cartonstore.fetch.http.policy import describe
from cartonstore.fetch.http.proxies import proxy_parser

from . import values as v

_DEFAULTS = RegistryConfig()
_AUTHORITY = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


def _check_hosts(hosts: tuple[str, ...]) -> None:
    for host in hosts:
        if not _AUTHORITY.fullmatch(host):
            raise InvalidInput(f"{host!r} is not a registry host or host:port (no scheme, no path)")


def _mirrors(value: object) -> Mapping[str, tuple[str, ...]]:
    """[registries.mirrors."host"] tables, each with endpoints = [URL, ...]:
    an http(s) URL of a registry (a path prefix allowed, no query)."""
    if not isinstance(value, Mapping):
        raise v.BadValue(f'expected tables [registries.mirrors."registry.example.com"] with endpoints = [...], '
                         f"got {value!r}")
    out = {}
    for host, table in value.items():
        if not isinstance(host, str):
            raise v.BadValue(f"mirrors: {host!r} is not a registry host or host:port")
        _check_hosts((host,))
        if not isinstance(table, Mapping) or set(table) != {"endpoints"}:
            raise v.BadValue(f'mirrors."{host}": expected endpoints = ["https://mirror", ...] and nothing else, '
                             f"got {table!r}")
        endpoints = v.strings()(table["endpoints"])
        for url in endpoints:
            v.url_prefix(url, what=f'mirrors."{host}": a registry mirror is an http(s) URL prefix '
                                   f"(cartonstore adds /v2/<repository>/...)")
            if urlsplit(url).path.rstrip("/").endswith("/v2"):
                raise v.BadValue(f'mirrors."{host}": {describe(url)!r}: give the mirror\'s base URL, without /v2 '
                                 f"(cartonstore adds /v2/<repository>/..., as containerd does)")
        if host.lower() in out:
            raise v.BadValue(f"mirrors: {host!r} is listed twice (host names are not case-sensitive)")
        out[host.lower()] = tuple(url.rstrip("/") for url in endpoints)
    return MappingProxyType(out)


def _show_mirrors(mirrors: Mapping[str, tuple[str, ...]]) -> dict[str, dict[str, list[str]]]:
    return {host: {"endpoints": list(urls)} for host, urls in mirrors.items()}


@dataclass(frozen=True)
class RegistrySettings:
    """[registries]"""

    insecure: tuple[str, ...] = v.setting(_DEFAULTS.insecure, v.strings(_check_hosts))
    ca_file: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()
    auth_file: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()
    chunk_size: int = v.size_setting(_DEFAULTS.chunk_size, 1 << 20)
    proxy: str | None = v.setting(None, proxy_parser("registries.proxy"), lambda p: p or "")
    mirrors: Mapping[str, tuple[str, ...]] = v.setting(None, _mirrors, _show_mirrors,
                                                       factory=lambda: MappingProxyType({}))
    mirror_down_for: float = v.duration_setting(_DEFAULTS.mirror_down_for, positive=False)

    def registry_config(self) -> RegistryConfig:
        return RegistryConfig(tuple(h.lower() for h in self.insecure), self.ca_file, self.auth_file,
                              self.chunk_size, self.proxy, self.mirrors, self.mirror_down_for)
