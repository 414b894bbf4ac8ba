"""The client's address, resolved once per request from the peer and `trusted_proxies`, for every reader.

The IP limit, the keys' `allowed_ips` and the audit all read `scope["client"]`, which the entry (`direct_entry.py`) rewrites:
the peer itself, or, when the peer is a trusted proxy, the rightmost X-Forwarded-For hop that is not one (the
leftmost entries are whatever the client chose to send). Nobody is trusted unless configured, and uvicorn's own
proxy-header handling is off (gateway/server.py), so a local process cannot choose its address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from starlette.types import Scope

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def resolve_client(peer: str | None, forwarded_for: str | None, trusted: Sequence[IpNetwork]) -> IpAddress | None:
    address = parse_address(peer)
    if address is None or not forwarded_for or not _is_trusted(address, trusted):
        return address
    for entry in reversed(forwarded_for.split(",")):
        hop = parse_address(entry.strip())
        if hop is None:
            break  # an unreadable hop: the last trusted proxy is as far as we can believe
        address = hop
        if not _is_trusted(hop, trusted):
            break
    return address


def with_client(scope: Scope, trusted: Sequence[IpNetwork]) -> Scope:
    """`scope` with its client resolved: a copy when a trusted proxy forwarded it, else `scope` itself."""
    if not trusted or not scope.get("client"):
        return scope
    host, port = scope["client"]
    forwarded = ", ".join(v.decode("latin-1") for k, v in scope["headers"] if k == b"x-forwarded-for")
    address = resolve_client(host, forwarded or None, trusted)
    if address is None:
        return scope
    return {**scope, "client": (str(address), port)}


def parse_address(text: str | None) -> IpAddress | None:
    if not text:
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address


def _is_trusted(address: IpAddress, trusted: Sequence[IpNetwork]) -> bool:
    return any(address in network for network in trusted)
