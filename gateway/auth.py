"""Bearer-token authentication of API keys (through quota/, with their IP allowlists) and of the admin key."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from gateway.errors import ApiError, forbidden, unauthorized, unavailable
from quota import KeyInfo, QuotaService, address_allowed


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def authenticate(quota: QuotaService, request: Request) -> KeyInfo:
    """The key behind the request's bearer token, or the 401/403/503 the client must see."""
    # Anthropic's clients send the key in x-api-key; either header works on every route
    secret = bearer_token(request) or request.headers.get("x-api-key", "").strip() or None
    if secret is None:
        raise unauthorized("missing API key: send 'Authorization: Bearer tg-...' or 'x-api-key: tg-...'")
    result = await quota.authenticate(secret)
    if result.ok and result.key is not None:
        if not address_allowed(result.key.allowed_ips, client_address(request)):
            raise forbidden("this API key may not be used from this address", "ip_not_allowed")
        return result.key
    if result.reason == "store_unavailable":
        raise unavailable("the key store is unavailable; retry shortly", retry_after=1.0,
                          code="store_unavailable")
    if result.reason in ("revoked", "expired"):
        raise forbidden(f"this API key is {result.reason}", f"key_{result.reason}")
    raise unauthorized("incorrect API key provided")


def client_address(request: Request) -> str | None:
    """The client's address as resolved once from the peer and `trusted_proxies` (path/client_address.py)."""
    return request.client.host if request.client is not None else None


def check_token(request: Request, expected: str, what: str) -> None:
    """Raises a 401 unless the request's bearer token is `expected` (compared in constant time)."""
    token = bearer_token(request)
    if token is None or not hmac.compare_digest(token.encode(), expected.encode()):
        raise ApiError(401, f"incorrect {what}", "invalid_request_error", f"invalid_{what.replace(' ', '_')}")
