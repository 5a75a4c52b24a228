"""Which URLs the fetcher may ask for, and how to name them in messages.

Pure functions over URL strings; nothing here resolves names or connects.
The host is read with yarl, the parser aiohttp itself uses, so the host
that is checked is the host that will be contacted.

Host patterns (allow_hosts, deny_hosts), matched case-insensitively:

    models.example.com     that host only
    *.example.com          any subdomain (a.example.com, a.b.example.com),
                           not example.com itself
    10.1.2.3, ::1          that IP address (an IP-literal host)
    10.0.0.0/8, fd00::/8   any IP address in the network

Names are compared in their ASCII (punycode) form with one trailing dot
dropped, so "bücher.example", "BÜCHER.example." and "xn--bcher-kva.example"
are one host. IP patterns match only IP-literal hosts: a DNS name is never
resolved here, so refusing private addresses reached *through* DNS is the
connector's job. An IPv4-mapped IPv6 host (::ffff:10.0.0.1) matches IPv4
patterns too, and IPv4 written in forms that resolvers accept but people do
not read (0x7f.1, 2130706433, 010.0.0.1) is refused, so it cannot slip past
a CIDR pattern.

Link-local and cloud metadata hosts (169.254.0.0/16, fe80::/10,
fd00:ec2::254, its NAT64 form, 100.100.100.200, metadata.google.internal)
are refused unless allow_hosts
names them: a URL a caller hands the daemon must not reach the node's cloud
credentials (checked again at every redirect, as every host is).

A URL a carton names (its LINKS) is the carton author's, not the caller's:
``check_link`` refuses it loopback, link-local, private (RFC 1918, ULA),
unspecified, multicast and other non-global addresses, in every form a
resolver reads (2130706433, 0x7f.1, [::ffff:127.0.0.1]) and the names that
are loopback by definition (localhost, *.localhost), unless
allow_private_links is set or allow_hosts names the host. A name that
resolves there is refused by the resolver (resolver.py), at connect time.

Credentials in the URL (https://user:token@host/) are allowed: private
mirrors use them. ``describe`` keeps them, and query strings (which carry the
signatures of presigned URLs), out of every message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from cartonstore.errors import FetchError, InvalidInput

from .addresses import host_class, legacy_ipv4

ALLOWED_SCHEMES = ("http", "https")
LINKS_SETTING = "fetch.allow_private_links"
METADATA_HOSTS = ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254", "64:ff9b::a9fe:0/112",   # NAT64 of 169.254/16
                  "100.100.100.200", "metadata.google.internal")

# ipaddress and urllib.parse are imported where hosts are parsed: the
# settings import this module for its defaults, and `cartonstore path` must
# start fast.
if TYPE_CHECKING:
    import ipaddress

    IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
    IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")
# What resolvers (inet_aton, WHATWG URL) would take for an IPv4 address.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:)?//[^/?#]*@")


def describe(url: str) -> str:
    """``url`` as it may appear in messages and logs.

    Drops userinfo and fragment, and replaces the query with ``?...`` (it
    says there was one without saying what: presigned URLs carry their
    signature there). Control characters are escaped so a hostile URL
    cannot forge log lines. Never raises, whatever the string.
    """
    base = _USERINFO.sub(lambda match: (match.group(1) or "") + "//", url.split("#", 1)[0])
    base, question, _ = base.partition("?")
    return "".join(_printable(c) for c in base) + ("?..." if question else "")


def _printable(char: str) -> str:
    return char if char.isprintable() else char.encode("unicode_escape").decode("ascii")


def redirect_target(base_url: str, location: str) -> str:
    """The URL a redirect's Location header points to, relative to ``base_url``.

    Absolute, scheme-relative (//host/p) and relative references are all
    resolved (RFC 3986, 5.2). The result is not checked: pass it to
    ``UrlPolicy.check`` before following it. Raises FetchError for an empty
    Location or one with control characters (the server's fault).
    """
    location = location.strip(" \t")
    if not location:
        raise FetchError(f"redirect without a Location from {describe(base_url)}",
                         subject=base_url)
    if _has_controls(location):
        raise FetchError(
            f"redirect Location contains whitespace or control characters: "
            f"{describe(location)} (from {describe(base_url)})",
            subject=base_url,
        )
    from urllib.parse import urljoin

    return urljoin(base_url, location)


@dataclass(frozen=True)
class UrlPolicy:
    """The URLs a fetch may use: http(s) only, hosts filtered by patterns.

    ``deny_hosts`` wins over ``allow_hosts``; an empty ``allow_hosts``
    allows every host not denied. ``max_redirects`` is for the fetcher,
    which checks every redirect target with ``check`` as well. Bad patterns
    raise InvalidInput when the policy is made.
    """

    allow_hosts: tuple[str, ...] = ()
    deny_hosts: tuple[str, ...] = ()
    max_redirects: int = 5
    allow_private_links: bool = False   # URLs a carton names may reach non-global addresses (check_link)

    def __post_init__(self) -> None:
        for field in ("allow_hosts", "deny_hosts"):
            patterns = getattr(self, field)
            if isinstance(patterns, str):
                raise InvalidInput(f"{field} must be a list of host patterns, not a string",
                                   subject=field)
            object.__setattr__(self, field, tuple(patterns))
            _compile(getattr(self, field), field)
        if self.max_redirects < 0:
            raise InvalidInput("max_redirects must be 0 or more", subject="max_redirects")

    def check(self, url: str) -> str:
        """Return ``url`` unchanged if it may be fetched, else raise InvalidInput."""
        host = _host_of(url)
        if _matches(_compile(self.deny_hosts, "deny_hosts"), host):
            raise InvalidInput(f"host '{host}' is denied (deny_hosts): {describe(url)}",
                               subject=url)
        allow = _compile(self.allow_hosts, "allow_hosts")
        if allow and not _matches(allow, host):
            raise InvalidInput(f"host '{host}' is not in allow_hosts: {describe(url)}",
                               subject=url)
        if self._metadata(host):
            raise InvalidInput(f"host '{host}' is a link-local or cloud metadata address, refused unless "
                               f"fetch.allow_hosts names it: {describe(url)}", subject=url)
        return url

    def check_link(self, url: str) -> str:
        """``check`` for a URL a carton names: besides, unless
        allow_private_links or allow_hosts names its host, it may not name a
        non-global address (``host_class``) in any form. Raises
        RefusedByPolicy, before anything is asked of the network."""
        if not self.allow_private_links:
            host = _link_host(url)
            kind = host_class(host) if host is not None else None
            if kind is not None and host is not None and not _matches(_compile(self.allow_hosts, "allow_hosts"), host):
                raise RefusedByPolicy(f"{describe(url)}: {link_refusal(f'{_article(kind)} {kind} address ({host})')}",
                                      subject=url)
        return self.check(url)

    def refuses_address(self, address: str) -> bool:
        """Whether ``address`` (a name or an IP address, as a resolver
        answers it) is a link-local or metadata host allow_hosts does not name."""
        host = _parse_host(address)
        return host is not None and self._metadata(host)

    def names(self, host: str) -> bool:
        """Whether allow_hosts names this host (then it may point anywhere)."""
        parsed = _parse_host(host)
        return parsed is not None and _matches(_compile(self.allow_hosts, "allow_hosts"), parsed)

    def _metadata(self, host: str | IpAddress) -> bool:
        return _matches(_compile(METADATA_HOSTS, "metadata hosts"), host) and \
            not _matches(_compile(self.allow_hosts, "allow_hosts"), host)


class RefusedByPolicy(FetchError):
    """A URL would reach an address its request may not (a URL a carton
    names a non-global one; any URL a metadata one, through DNS): nothing
    was sent to it, so the message says nothing about what listens there,
    and it is never retried."""


def link_refusal(what: str) -> str:
    """Why a URL a carton names is not fetched, and the setting that would allow it."""
    return (f"refused by policy: a URL a carton names may not reach {what}; "
            f"{LINKS_SETTING} = true (or the host in fetch.allow_hosts) allows it")


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _link_host(url: str) -> str | IpAddress | None:
    """The host of url as a resolver would read it, IPv4 in the legacy forms
    ``check`` refuses (0x7f.1, 2130706433) included; None if there is none.
    Never raises: ``check`` says what is wrong with a malformed URL."""
    from yarl import URL

    try:
        raw = URL(url).raw_host
    except (ValueError, TypeError):
        return None
    if not raw:
        return None
    host = _parse_host(raw)
    return host if host is not None else legacy_ipv4(raw.lower().removesuffix("."))


def _has_controls(text: str) -> bool:
    return any(ord(char) <= 0x20 or ord(char) == 0x7F for char in text)


def _host_of(url: str) -> str | IpAddress:
    """The host of an acceptable URL: an IP address or an ASCII name."""
    if _has_controls(url):
        raise InvalidInput(f"URL contains whitespace or control characters: {describe(url)}",
                           subject=url)
    from yarl import URL  # imported here: every command loads this module, few check a URL

    try:
        parsed = URL(url)
        parsed.port  # noqa: B018 - yarl validates the port when asked
    except ValueError as error:
        raise InvalidInput(f"malformed URL ({error}): {describe(url)}", subject=url) from None
    scheme = parsed.scheme.lower()
    if not scheme:
        raise InvalidInput(f"URL has no scheme (only http and https are allowed): "
                           f"{describe(url)}", subject=url)
    if scheme not in ALLOWED_SCHEMES:
        raise InvalidInput(f"scheme '{scheme}' is not allowed (only http and https): "
                           f"{describe(url)}", subject=url)
    if not parsed.raw_host:
        raise InvalidInput(f"URL has no host: {describe(url)}", subject=url)
    host = _parse_host(parsed.raw_host)
    if host is None:
        raise InvalidInput(f"URL has an invalid host '{parsed.raw_host}': {describe(url)}",
                           subject=url)
    return host


def _parse_host(text: str) -> str | IpAddress | None:
    """An IP address or a lowercase ASCII name without trailing dot; None if
    ``text`` is neither."""
    import ipaddress

    text = text.strip("[]").lower()
    if ":" in text:
        try:
            return ipaddress.IPv6Address(text.split("%", 1)[0])  # the zone does not matter
        except ValueError:
            return None
    name = text.removesuffix(".")
    if not name.isascii():
        import idna  # imported here: only names beyond ASCII need it

        try:
            name = idna.encode(name, uts46=True).decode("ascii")
        except idna.IDNAError:
            return None
    if _NUMERIC_LABEL.fullmatch(name.rpartition(".")[2]):
        try:
            return ipaddress.IPv4Address(name)
        except ValueError:
            return None
    return name if _NAME.fullmatch(name) else None


@dataclass(frozen=True)
class _Pattern:
    exact: str | None = None
    suffix: str | None = None  # ".example.com" for "*.example.com"
    network: IpNetwork | None = None

    def matches(self, host: str | IpAddress) -> bool:
        if isinstance(host, str):
            return host == self.exact or (self.suffix is not None and host.endswith(self.suffix))
        if self.network is None:
            return False
        mapped = getattr(host, "ipv4_mapped", None)
        return _in(host, self.network) or (mapped is not None and _in(mapped, self.network))


def _in(address: IpAddress, network: IpNetwork) -> bool:
    return address.version == network.version and address in network


@lru_cache(maxsize=64)
def _compile(patterns: tuple[str, ...], field: str) -> tuple[_Pattern, ...]:
    return tuple(_compile_one(pattern, field) for pattern in patterns)


def _compile_one(pattern: str, field: str) -> _Pattern:
    import ipaddress

    text = pattern.strip()
    if "/" in text:
        try:
            return _Pattern(network=ipaddress.ip_network(text.strip("[]"), strict=False))
        except ValueError:
            pass
    else:
        wildcard = text.startswith("*.")
        host = _parse_host(text[2:] if wildcard else text)
        if isinstance(host, str):
            return _Pattern(suffix="." + host) if wildcard else _Pattern(exact=host)
        if host is not None and not wildcard:
            return _Pattern(network=ipaddress.ip_network(host))
    raise InvalidInput(
        f"bad host pattern {pattern!r} in {field} (use a host name, *.domain, "
        f"an IP address or a CIDR network)",
        subject=field,
    )


def _matches(patterns: tuple[_Pattern, ...], host: str | IpAddress) -> bool:
    return any(pattern.matches(host) for pattern in patterns)


def host_matches(url: str, patterns: tuple[str, ...], field: str) -> bool:
    """Whether url's host matches one of ``patterns`` (the grammar above)."""
    return _matches(_compile(patterns, field), _host_of(url))
