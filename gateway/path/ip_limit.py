"""A fixed window of requests per minute per client address block, before authentication.

It guards the auth path (key guessing, floods) at the cost of a dictionary lookup: nothing here reads the store.
The client is `scope["client"]` as `client_address.py` resolved it from `trusted_proxies`; the entry
(`direct_entry.py`) asks before any route runs.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable

from starlette.responses import Response
from starlette.types import Scope

from config import IpRateLimit
from gateway.errors import ApiError, retry_after_headers
from gateway.path.client_address import IpAddress, parse_address

WINDOW = 60.0
GUARDED = ("/v1/", "/admin")  # the routes that authenticate; health and metrics stay reachable


class IpWindow:
    """Counts requests per address block in the current minute; the previous minute is forgotten at once."""

    def __init__(self, settings: IpRateLimit, clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        self._clock = clock
        self._window = -1
        self._counts: dict[str, int] = {}

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


def ip_refusal(window: IpWindow, scope: Scope) -> Response | None:
    """Counts an HTTP request to a guarded route against its client's block: None when it fits, else the 429."""
    if not scope["path"].startswith(GUARDED):
        return None
    client = scope.get("client")
    address = parse_address(client[0] if client else None)
    wait = None if address is None else window.hit(window.block(address))
    if wait is None:
        return None
    error = ApiError(429, f"too many requests from this address block; retry after {wait:.0f}s",
                     "rate_limit_exceeded", "ip_rate_limit_exceeded", None, retry_after_headers(wait))
    return error.response()
