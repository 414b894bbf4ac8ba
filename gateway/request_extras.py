"""The backend request extras the gateway owns: it sets them from the key, never from the client's body.

- `cache_salt` scopes the upstream's prefix cache to one account: without it, tenant B could confirm tenant A's
  prompt by timing or by the `cached_tokens` a guess brings back.
- `priority` orders the upstream's queue: it comes from the priority class the gateway chose, so a client cannot
  jump other tenants' requests by writing a number into its body.
"""

from __future__ import annotations

import hashlib
from typing import Any

from config import REQUEST_EXTRAS
from gateway.priority import PriorityPool
from quota import KeyInfo

OWNED_FIELDS = frozenset(REQUEST_EXTRAS)  # dropped from every client body


def cache_salt(account_id: str) -> str:
    # a digest, so that upstream logs and caches never learn account ids
    return hashlib.sha256(f"tidegate-account:{account_id}".encode()).hexdigest()[:32]


def request_extras(key: KeyInfo, pool: PriorityPool) -> dict[str, Any]:
    """The extras for one request; each channel sends those its `extras` setting names."""
    extras: dict[str, Any] = {"cache_salt": cache_salt(key.account_id)}
    if pool.settings.upstream_priority is not None:
        extras["priority"] = pool.settings.upstream_priority
    return extras
