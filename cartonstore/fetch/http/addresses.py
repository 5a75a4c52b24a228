"""What kind of address a host is, for the URLs a carton names (policy.py,
resolver.py): loopback, link-local, private and the other non-global
kinds, IPv4 carried in IPv6 judged as itself, and IPv4 in the legacy forms
resolvers read (0x7f.1, 2130706433). Pure; nothing here resolves a name.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING

# ipaddress is imported where addresses are judged: `cartonstore path` imports this module and must start fast.
if TYPE_CHECKING:
    import ipaddress

    IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
    IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# RFC 1918 and the IPv6 unique local addresses (fc00::/7), and fec0::/10, site-local before them.
PRIVATE_NETWORKS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fec0::/10")


def host_class(host: str | IpAddress) -> str | None:
    """What kind of non-global host this is ("loopback", "private", ...),
    None for a global address or an ordinary name. Names are judged only
    when they are loopback by definition (RFC 6761): what others resolve to
    is the resolver's to judge."""
    if isinstance(host, str):
        return "loopback" if host == "localhost" or host.endswith(".localhost") else None
    return address_class(host)


def address_class(address: IpAddress) -> str | None:
    """"unspecified", "loopback", "link-local", "multicast", "private" or
    "non-global" (reserved, shared, documentation, ...); None for a global
    address. IPv4 carried in IPv6 (mapped, compatible, NAT64, 6to4) is
    judged as the IPv4 address it carries."""
    if address.version == 6:
        carried = _carried_ipv4(address)
        if carried is not None:
            return address_class(carried)
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if any(address in network for network in _networks(address.version)):
        return "private"
    if not address.is_global or address.is_reserved:
        return "non-global"
    return None


def _carried_ipv4(address: IpAddress) -> IpAddress | None:
    import ipaddress

    if not isinstance(address, ipaddress.IPv6Address):
        return None
    value = int(address)
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if value >> 32 == 0 and value > 1:   # ::a.b.c.d, IPv4-compatible (:: and ::1 are IPv6's own)
        return ipaddress.IPv4Address(value)
    if value >> 32 == 0x64FF9B << 64:    # 64:ff9b::/96, NAT64
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    return address.sixtofour


@lru_cache(maxsize=2)
def _networks(version: int) -> tuple[IpNetwork, ...]:
    import ipaddress

    return tuple(n for n in map(ipaddress.ip_network, PRIVATE_NETWORKS) if n.version == version)


def legacy_ipv4(name: str) -> IpAddress | None:
    """The address inet_aton and the WHATWG URL parser read in 0x7f.1,
    2130706433, 017700000001 or 127.1; None if name is none of these."""
    import ipaddress

    labels = name.split(".")
    if not 1 <= len(labels) <= 4:
        return None
    numbers = []
    for label in labels:
        if label.startswith("0x") and re.fullmatch(r"[0-9a-f]*", label[2:]):
            numbers.append(int(label[2:] or "0", 16))
        elif re.fullmatch(r"0[0-7]+", label):
            numbers.append(int(label, 8))
        elif label.isdigit() and label.isascii():
            numbers.append(int(label))
        else:
            return None
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        return None
    return ipaddress.IPv4Address(sum(n << 8 * (3 - i) for i, n in enumerate(head)) + last)
