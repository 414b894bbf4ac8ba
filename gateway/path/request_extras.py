"""The backend request extras the gateway owns: it sets them from the key, never from the client's body.

- `cache_salt` scopes the upstream's prefix cache to one account (or one key, or none: the account's
  `cache_scope`): without it, tenant B could confirm tenant A's prompt by timing or by the `cached_tokens` a guess
  brings back. It is an HMAC of the id under a gateway secret, so knowing an account id (they are not secret)
  does not give its salt to anyone who can reach the upstream directly.
- `priority` orders the upstream's queue: it comes from the priority class the gateway chose, so a client cannot
  jump other tenants' requests by writing a number into its body.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from typing import Any

from config import REQUEST_EXTRAS, GatewaySettings
from config.secret_files import new_token, read_secret, secret_file
from gateway.path.priority import PriorityPool
from quota import KeyInfo

OWNED_FIELDS = frozenset(REQUEST_EXTRAS)  # dropped from every client body
SALT_SECRET_FILE = "cache_salt_secret"  # in the data dir, when `cache_salt_secret_file` is not set


def salt_secret(settings: GatewaySettings) -> bytes:
    """The HMAC key of every cache salt: the configured file's, else one generated once into the data dir."""
    if settings.cache_salt_secret_file is not None:
        return read_secret(settings.cache_salt_secret_file, "cache_salt_secret").encode()
    return secret_file(settings.resolved_data_dir() / SALT_SECRET_FILE, new_token())[0].encode()


def cache_scope_salt(key: KeyInfo, secret: bytes) -> str | None:
    """The salt of the cache `key`'s requests may share; None for an account that shares the unsalted cache."""
    if key.cache_scope == "shared":
        return None
    scope = f"tidegate-key:{key.id}" if key.cache_scope == "key" else f"tidegate-account:{key.account_id}"
    return _salt(secret, scope)


@functools.lru_cache(maxsize=65536)  # asked twice a request (routing and extras), the same for every request of a key
def _salt(secret: bytes, scope: str) -> str:
    # keyed, so that a guess from an account id cannot be checked against the upstream's cache
    return hmac.new(secret, scope.encode(), hashlib.sha256).hexdigest()[:32]


def request_extras(key: KeyInfo, pool: PriorityPool, secret: bytes) -> dict[str, Any]:
    """The extras for one request; each channel sends those its `extras` setting names."""
    salt = cache_scope_salt(key, secret)
    extras: dict[str, Any] = {} if salt is None else {"cache_salt": salt}
    if pool.settings.upstream_priority is not None:
        extras["priority"] = pool.settings.upstream_priority
    return extras
