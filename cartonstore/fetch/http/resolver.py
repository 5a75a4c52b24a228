"""Names are judged by the addresses they resolve to, as those addresses
written in a URL are (policy.py): aiohttp's own resolver, its answers
filtered before aiohttp connects to any of them, so a name that points
elsewhere between a check and the connect (DNS rebinding) gains nothing.

- Every request: a name a caller hands the daemon (or a redirect points
  to) must not reach link-local or cloud metadata addresses (169.254.169.254)
  through DNS.
- Requests for URLs a carton names (``links=True``, their own connector):
  nor any other non-global address (loopback, private, ...), unless
  allow_private_links or allow_hosts names the host. The proxies the
  operator configured are resolved as they are (aiohttp resolves the proxy,
  not the URL's host, when it goes through one).
"""

from __future__ import annotations

import socket
from collections.abc import Collection
from typing import TYPE_CHECKING

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from .addresses import address_class
from .config import FetchConfig
from .policy import RefusedByPolicy, UrlPolicy, describe, link_refusal

if TYPE_CHECKING:
    from ipaddress import IPv4Address, IPv6Address


class AddressRefused(OSError):
    """A name resolves only to addresses its request may not reach (an
    OSError, as aiohttp expects of a resolver; http.translate names it)."""


class GuardedResolver(AbstractResolver):
    def __init__(self, policy: UrlPolicy, *, links: bool = False,
                 proxies: Collection[tuple[str, int]] = ()) -> None:
        """``proxies``: (host, port) of the configured proxies, resolved
        unfiltered; with ``links``, answers of any non-global class are refused."""
        self._inner = aiohttp.DefaultResolver()
        self._policy = policy
        self._links = links and not policy.allow_private_links
        self._proxies = {(host.lower(), port) for host, port in proxies}

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        if self._policy.names(host) or (host.lower().rstrip("."), port) in self._proxies:
            return answers   # the operator named this host: wherever it points
        kept = [a for a in answers if not self._policy.refuses_address(a["host"])]
        if not kept:
            raise AddressRefused(f"{host} resolves only to link-local or cloud metadata addresses "
                                 f"({', '.join(a['host'] for a in answers)}): refused unless fetch.allow_hosts "
                                 f"names it")
        if self._links:
            classes = {a["host"]: address_class(_address(a["host"])) for a in kept}
            kept = [a for a in kept if classes[a["host"]] is None]
            if not kept:   # which addresses is not said: a carton's author may not map the host's network
                kinds = ", ".join(sorted({kind for kind in classes.values() if kind is not None}))
                raise AddressRefused(link_refusal(f"{host}, which resolves only to {kinds} addresses"))
        return kept

    async def refuse_before_proxy(self, url: str) -> None:
        """A proxy resolves the host of a URL it is asked for, not this node:
        the host is resolved here too, and the URL refused (RefusedByPolicy)
        when it resolves only to addresses its request may not reach. A name
        that resolves otherwise at the proxy, or changes its answers in
        between, gets through (docs/fetching.md): the proxy's own rules hold then."""
        from yarl import URL

        parsed = URL(url)
        if not parsed.raw_host or parsed.port is None or _is_address(parsed.raw_host):
            return   # an address is judged as written (UrlPolicy.check_link)
        try:
            await self.resolve(parsed.raw_host, parsed.port, socket.AF_UNSPEC)
        except AddressRefused as e:
            raise RefusedByPolicy(f"{describe(url)}: {e}", subject=url) from None
        except OSError:
            pass   # what this node cannot resolve, the proxy may

    async def close(self) -> None:
        await self._inner.close()


def proxy_endpoints(config: FetchConfig) -> list[tuple[str, int]]:
    """(host, port) of each configured proxy (fetch.proxy, registries.proxy)."""
    from yarl import URL

    proxies = (URL(proxy) for proxy in (config.proxy, config.registries.proxy) if proxy)
    return [(proxy.raw_host, proxy.port) for proxy in proxies if proxy.raw_host and proxy.port]


def _is_address(host: str) -> bool:
    try:
        _address(host)
    except ValueError:
        return False
    return True


def _address(text: str) -> IPv4Address | IPv6Address:
    import ipaddress

    return ipaddress.ip_address(text.split("%", 1)[0])
