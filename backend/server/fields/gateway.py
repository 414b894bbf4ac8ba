"""Fields only the gateway may set: `cache_salt` (whose prefix cache a request reads, so a guessed salt would
reveal another tenant's prompts) and `priority` (a place in the queue ahead of everyone else's requests).

With `gateway_token_file` set, a request may carry them only with `Authorization: Bearer <that token>` (the
gateway's channel sends it as its api_key); anyone else gets a 400 naming the field, as vLLM answers a field it
refuses, rather than a silent drop that would leave a direct client believing its priority was taken. Without
the setting, the replica trusts every caller (a replica that only the gateway can reach).
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers

from backend.server.api_errors import invalid
from backend.server.protocol import ValidatedRequest


def check_gateway_fields(req: ValidatedRequest, headers: Headers, token: str | None) -> None:
    if token is None or (req.cache_salt is None and not req.priority):
        return
    scheme, _, presented = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode()):
        return
    field = "cache_salt" if req.cache_salt is not None else "priority"
    raise invalid(f"`{field}` is set by the gateway in front of this server; send the request without it",
                  field, "gateway_only_field")
