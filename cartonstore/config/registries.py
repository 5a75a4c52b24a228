"""[registries]: how OCI registries are reached (read by cartonstore.config).

    [registries]
    insecure = ["registry.lab:5000"]   # plain http allowed (loopback always is)
    ca_file = "/etc/cartonstore/registry-ca.pem"
    auth_file = "/etc/cartonstore/registry-auth.json"
    chunk_size = "64MiB"
    proxy = "http://proxy.lab:3128"    # "" for none; fetch.no_proxy applies
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cartonstore.errors import InvalidInput
from cartonstore.fetch.config import RegistryConfig
from cartonstore.fetch.proxies import proxy_parser

from . import values as v

_DEFAULTS = RegistryConfig()
_AUTHORITY = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


def _check_hosts(hosts: tuple[str, ...]) -> None:
    for host in hosts:
        if not _AUTHORITY.fullmatch(host):
            raise InvalidInput(f"{host!r} is not a registry host or host:port (no scheme, no path)")


@dataclass(frozen=True)
class RegistrySettings:
    """[registries]"""

    insecure: tuple[str, ...] = v.setting(_DEFAULTS.insecure, v.strings(_check_hosts))
    ca_file: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()
    auth_file: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()
    chunk_size: int = v.size_setting(_DEFAULTS.chunk_size, 1 << 20)
    proxy: str | None = v.setting(None, proxy_parser("registries.proxy"), lambda p: p or "")

    def registry_config(self) -> RegistryConfig:
        return RegistryConfig(tuple(h.lower() for h in self.insecure), self.ca_file, self.auth_file,
                              self.chunk_size, self.proxy)
