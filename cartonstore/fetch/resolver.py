"""Names that resolve to link-local or cloud metadata addresses are refused
like those addresses written in a URL (policy.py): a host name a caller
hands the daemon (or a redirect points to) must not reach 169.254.169.254
through DNS. aiohttp's own resolver, its answers filtered."""

from __future__ import annotations

import socket
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver

from .policy import UrlPolicy


class GuardedResolver(AbstractResolver):
    def __init__(self, policy: UrlPolicy) -> None:
        self._inner = aiohttp.DefaultResolver()
        self._policy = policy

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        answers = await self._inner.resolve(host, port, family)
        if self._policy.names(host):
            return answers   # the operator named this host: wherever it points
        kept = [a for a in answers if not self._policy.refuses_address(a["host"])]
        if not kept:
            raise OSError(f"{host} resolves only to link-local or cloud metadata addresses "
                          f"({', '.join(a['host'] for a in answers)}): refused unless fetch.allow_hosts names it")
        return kept

    async def close(self) -> None:
        await self._inner.close()

