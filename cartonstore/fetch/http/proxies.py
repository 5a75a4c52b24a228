"""Which HTTP(S) proxy, if any, a request goes through.

Origins (carton URLs, LINKS URLs, mirrors) use ``fetch.proxy``, registries
(and their token servers) ``registries.proxy``, so that a pull-through
cache or a P2P agent such as Dragonfly's dfdaemon can sit in front of
either. Peers are always reached directly: they are the fleet itself.

``fetch.no_proxy`` lists hosts reached directly whatever the proxies, in
the forms curl and Go accept:

    *                    every host (proxies off)
    example.com          that host and every subdomain of it
    .example.com         the same
    *.example.com        subdomains only (the allow_hosts grammar)
    10.1.2.3, ::1        that address
    10.0.0.0/8           any address in the network

Names are not resolved: an IP pattern matches only URLs written with an
IP address. Pure; nothing here connects.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from cartonstore.errors import InvalidInput

from .config import FetchConfig
from .policy import describe, host_matches

FIELD = "fetch.no_proxy"


@lru_cache(maxsize=16)
def host_patterns(no_proxy: tuple[str, ...]) -> tuple[str, ...]:
    """no_proxy entries as allow_hosts patterns ("*" is handled by the caller)."""
    patterns: list[str] = []
    for entry in no_proxy:
        text = entry.strip()
        if not text or text == "*":
            continue
        if text.startswith("*.") or "/" in text or ":" in text or text.replace(".", "").isdigit():
            patterns.append(text)
        else:
            name = text.removeprefix(".")
            patterns += [name, f"*.{name}"]
    return tuple(patterns)


def check_no_proxy(no_proxy: tuple[str, ...]) -> None:
    """Raise InvalidInput naming an entry that is no host, domain, address or network."""
    for entry in no_proxy:
        try:
            host_matches("http://example.invalid/", host_patterns((entry,)), FIELD)
        except InvalidInput:
            raise InvalidInput(f"{FIELD}: {entry!r} is not a host, .domain, IP address or CIDR network "
                               f"(ports are not part of an entry)", subject=FIELD) from None


def check_proxy(url: str, field: str) -> str:
    """A proxy is http://HOST:PORT (credentials allowed); https proxies are not supported by aiohttp."""
    from yarl import URL

    try:
        parsed = URL(url)
        parsed.port  # noqa: B018 - validated when asked
    except ValueError as e:
        raise InvalidInput(f"{field}: malformed proxy URL ({e}): {describe(url)}", subject=field) from None
    if parsed.scheme != "http" or not parsed.host:
        raise InvalidInput(f"{field}: a proxy is http://HOST:PORT (it tunnels https with CONNECT), "
                           f"got {describe(url)}", subject=field)
    if parsed.path not in ("", "/") or parsed.query_string:
        raise InvalidInput(f"{field}: a proxy URL has no path or query, got {describe(url)}", subject=field)
    return url


def proxy_parser(field: str) -> Callable[[object], str | None]:
    """The setting's parser: "" is no proxy."""
    def parse(value: object) -> str | None:
        if not isinstance(value, str):
            raise InvalidInput(f'expected a proxy URL (http://HOST:PORT) or "" for none, got {value!r}')
        return check_proxy(value, field) if value else None
    return parse


def proxy_for(config: FetchConfig, url: str, kind: str) -> str | None:
    """The proxy a request for ``url``, a source of this kind ("url",
    "mirror", "registry", "peer"), goes through; None: directly."""
    proxy = config.registries.proxy if kind == "registry" else None if kind == "peer" else config.proxy
    if proxy is None or "*" in config.no_proxy:
        return None
    patterns = host_patterns(config.no_proxy)
    return None if patterns and host_matches(url, patterns, FIELD) else proxy
