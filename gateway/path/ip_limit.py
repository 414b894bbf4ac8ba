"""A fixed window of requests per minute per client address block, before authentication.

It guards the auth path (key guessing, floods) at the cost of a dictionary lookup: nothing here reads the store.
The client is the connection's peer, or, when the peer is a trusted proxy, the rightmost address of
X-Forwarded-For that is not a trusted proxy (the leftmost entries are whatever the client chose to send).
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from config import IpRateLimit
from gateway.errors import ApiError, retry_after_headers

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
WINDOW = 60.0
GUARDED = ("/v1/", "/admin")  # the routes that authenticate; health and metrics stay reachable


class IpWindow:
    """Counts requests per address block in the current minute; the previous minute is forgotten at once."""

    def __init__(self, settings: IpRateLimit, clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        self._clock = clock
        self._trusted = settings.trusted_proxies
        self._window = -1
        self._counts: dict[str, int] = {}

    def client(self, peer: str | None, forwarded_for: str | None) -> IpAddress | None:
        address = _parse(peer)
        if address is None or not forwarded_for or not self._is_trusted(address):
            return address
        for entry in reversed(forwarded_for.split(",")):
            hop = _parse(entry.strip())
            if hop is None:
                break  # an unreadable hop: the last trusted proxy is as far as we can believe
            address = hop
            if not self._is_trusted(hop):
                break
        return address

    def block(self, address: IpAddress) -> str:
        prefix = self._settings.per_cidr_v4 if address.version == 4 else self._settings.per_cidr_v6
        return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))

    def hit(self, block: str) -> float | None:
        """Counts one request; None when it fits, else the seconds until the window ends."""
        now = self._clock()
        window = int(now // WINDOW)
        if window != self._window:
            self._window, self._counts = window, {}
        count = self._counts.get(block, 0) + 1
        if count > self._settings.rpm:
            return (window + 1) * WINDOW - now
        self._counts[block] = count
        return None

    def _is_trusted(self, address: IpAddress) -> bool:
        return any(address in network for network in self._trusted)


class IpRateLimitMiddleware:
    def __init__(self, app: ASGIApp, settings: IpRateLimit) -> None:
        self.app = app
        self.window = IpWindow(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(GUARDED):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        forwarded = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-forwarded-for"), None)
        address = self.window.client(client[0] if client else None, forwarded)
        wait = None if address is None else self.window.hit(self.window.block(address))
        if wait is None:
            await self.app(scope, receive, send)
            return
        error = ApiError(429, f"too many requests from this address block; retry after {wait:.0f}s",
                         "rate_limit_exceeded", "ip_rate_limit_exceeded", None, retry_after_headers(wait))
        await error.response()(scope, receive, send)


def _parse(text: str | None) -> IpAddress | None:
    if not text:
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address
