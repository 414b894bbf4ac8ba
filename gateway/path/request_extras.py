"""The backend request extras the gateway owns: it sets them from the key, never from the client's body.

- `cache_salt` scopes the upstream's prefix cache to one account (or one key, or none: the account's
  `cache_scope`): without it, tenant B could confirm tenant A's prompt by timing or by the `cached_tokens` a guess
  brings back.
- `priority` orders the upstream's queue: it comes from the priority class the gateway chose, so a client cannot
  jump other tenants' requests by writing a number into its body.
"""

from __future__ import annotations

import hashlib
from typing import Any

from config import REQUEST_EXTRAS
from gateway.path.priority import PriorityPool
from quota import KeyInfo

OWNED_FIELDS = frozenset(REQUEST_EXTRAS)  # dropped from every client body


def cache_salt(account_id: str) -> str:
    # a digest, so that upstream logs and caches never learn account ids
    return hashlib.sha256(f"tidegate-account:{account_id}".encode()).hexdigest()[:32]


def cache_scope_salt(key: KeyInfo) -> str | None:
    """The salt of the cache `key`'s requests may share; None for an account that shares the unsalted cache."""
    if key.cache_scope == "shared":
        return None
    if key.cache_scope == "key":
        return hashlib.sha256(f"tidegate-key:{key.id}".encode()).hexdigest()[:32]
    return cache_salt(key.account_id)


def request_extras(key: KeyInfo, pool: PriorityPool) -> dict[str, Any]:
    """The extras for one request; each channel sends those its `extras` setting names."""
    salt = cache_scope_salt(key)
    extras: dict[str, Any] = {} if salt is None else {"cache_salt": salt}
    if pool.settings.upstream_priority is not None:
        extras["priority"] = pool.settings.upstream_priority
    return extras
