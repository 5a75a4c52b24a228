"""Which hosts are this machine: loopback names and addresses."""

from __future__ import annotations


def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8, ::1, or ::ffff:127.x (no name is resolved)."""
    host = host.strip("[]")
    if host.lower().rstrip(".") == "localhost":
        return True
    import ipaddress

    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
