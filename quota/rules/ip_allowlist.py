"""Per-key IP allowlists: addresses and CIDR blocks, validated when set and matched on every request."""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from quota.records import InvalidRequest

MAX_ENTRIES = 256
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_allowlist(value: object) -> list[str] | None:
    """The allowlist in canonical form (`10.0.0.0/8`, `192.0.2.7/32`), or None for "any address"."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or len(value) > MAX_ENTRIES:
        raise InvalidRequest(f"allowed_ips must be a non-empty list of at most {MAX_ENTRIES} addresses or CIDR "
                             "blocks, or null")
    out = []
    for entry in value:
        if not isinstance(entry, str) or len(entry) > 64:
            raise InvalidRequest("allowed_ips entries must be IP addresses or CIDR blocks (strings)")
        try:
            out.append(str(ipaddress.ip_network(entry.strip(), strict=False)))
        except ValueError:
            raise InvalidRequest(f"allowed_ips: {entry!r} is not an IP address or CIDR block") from None
    return out


@lru_cache(maxsize=4096)
def _networks(allowlist: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(entry) for entry in allowlist)


def address_allowed(allowlist: tuple[str, ...] | None, address: str | None) -> bool:
    """True when the list is absent or holds the address; an unknown or unparsable address is refused."""
    if allowlist is None:
        return True
    if address is None:
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a dual-stack socket reports IPv4 clients as ::ffff:a.b.c.d
    return any(ip in network for network in _networks(allowlist))
