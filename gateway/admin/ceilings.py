"""An account admin's key writes stay within its account's ceilings: the models and the most important priority
class that owners and operators set on the account (`models`, `max_priority_class`). The gateway applies the
same ceilings to every request (quota.records.KeyInfo.of, PriorityPools.choose); this refuses, with a 400, a
write that asks for more, so that an account admin sees what its keys really get."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.errors import invalid_request
from quota import QuotaService


async def within_account(quota: QuotaService, account_id: str, body: dict[str, Any], classes: Sequence[str],
                         creating: bool) -> dict[str, Any]:
    """The body, with a new key's omitted `models` set to the account's; 400 for what exceeds a ceiling.
    `classes` are the configured priority classes, most important first."""
    account = await quota.admin.get_account(account_id)
    ceiling, asked = account.max_priority_class, body.get("priority_class")
    if ceiling in classes and isinstance(asked, str) and asked in classes and \
            classes.index(asked) < classes.index(ceiling):
        raise invalid_request(f"priority_class {asked!r} is above the account's max_priority_class {ceiling!r}",
                              "priority_class")
    allowed = account.models
    if allowed is None:
        return body
    if creating and "models" not in body:
        return {**body, "models": list(allowed)}  # a new key gets what its account may use, never more
    if "models" in body:
        models = body["models"]
        if models is None:
            raise invalid_request(f"the account allows only the models {allowed}: a key's models cannot be "
                                  "cleared", "models")
        outside = sorted({m for m in models if m not in allowed}) if isinstance(models, list) else []
        if outside:
            raise invalid_request(f"models {outside} are not among the account's models {allowed}", "models")
    return body
