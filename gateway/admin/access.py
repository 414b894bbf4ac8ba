"""Who may call which admin route: the caller behind the bearer token, the admin API's one route table (route x
role), and the scoping that keeps an account admin inside its own account.

The table is data: one row per (method, route path), whose action names the handler that serves it. The admin API
builds its routes from these rows alone, so a route cannot exist without its rule. A HEAD request, which reaches
a GET route, has no row of its own and is for owners and operators only.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from starlette.requests import Request

from gateway.auth import bearer_token
from gateway.errors import ApiError, forbidden, invalid_request
from quota import NotFound, Quota, QuotaService, Role

BOOTSTRAP = "bootstrap"  # the actor name of the configured admin_key
BodyReader = Callable[[], Awaitable[dict[str, Any]]]


class Scope(StrEnum):
    """How a route names the tenant data it touches, so that an account admin's calls can be checked."""

    none = "none"  # not tenant data
    accounts = "accounts"  # the account list: narrowed to the caller's account by the handler
    account = "account"  # path {id} is an account
    sub_account = "sub_account"  # path {id} is a sub-account
    key = "key"  # path {id} is an API key
    record = "record"  # path {kind}/{id}: an account, sub-account or key
    admin_key = "admin_key"  # path {id} is an admin key
    body_owner = "body_owner"  # the body's account_id or sub_account_id
    query_owner = "query_owner"  # the query's account_id, sub_account_id or key_id


@dataclass(slots=True, frozen=True)
class Rule:
    roles: frozenset[Role]
    action: str  # the audit log's name for what the route does
    scope: Scope = Scope.none


OWNERS = frozenset({Role.owner})
STAFF = frozenset({Role.owner, Role.operator})
READERS = frozenset({*STAFF, Role.viewer})
TENANT_WRITERS = frozenset({*STAFF, Role.account_admin})
EVERYONE = frozenset(Role)

# in the order Starlette tries them: the channels' and MCP servers' PATCH before the generic one
RULES: dict[tuple[str, str], Rule] = {
    ("GET", "/admin/channels"): Rule(READERS, "channels.list"),
    ("POST", "/admin/channels"): Rule(STAFF, "channels.create"),
    ("GET", "/admin/channels/{name}"): Rule(READERS, "channels.read"),
    ("PATCH", "/admin/channels/{name}"): Rule(STAFF, "channels.update"),
    ("DELETE", "/admin/channels/{name}"): Rule(STAFF, "channels.remove"),
    ("GET", "/admin/model-groups"): Rule(READERS, "model-groups.list"),
    ("GET", "/admin/model-groups/{name}"): Rule(READERS, "model-groups.read"),
    ("PUT", "/admin/model-groups/{name}"): Rule(STAFF, "model-groups.set"),
    ("DELETE", "/admin/model-groups/{name}"): Rule(STAFF, "model-groups.remove"),
    ("GET", "/admin/mcp-servers"): Rule(READERS, "mcp-servers.list"),
    ("POST", "/admin/mcp-servers"): Rule(STAFF, "mcp-servers.create"),
    ("GET", "/admin/mcp-servers/{name}"): Rule(READERS, "mcp-servers.read"),
    ("PATCH", "/admin/mcp-servers/{name}"): Rule(STAFF, "mcp-servers.update"),
    ("DELETE", "/admin/mcp-servers/{name}"): Rule(STAFF, "mcp-servers.remove"),
    ("POST", "/admin/accounts"): Rule(STAFF, "accounts.create"),
    ("GET", "/admin/accounts"): Rule(EVERYONE, "accounts.list", Scope.accounts),
    ("GET", "/admin/accounts/{id}"): Rule(EVERYONE, "accounts.read", Scope.account),
    ("POST", "/admin/accounts/{id}/sub-accounts"): Rule(TENANT_WRITERS, "sub-accounts.create", Scope.account),
    ("GET", "/admin/accounts/{id}/sub-accounts"): Rule(EVERYONE, "sub-accounts.list", Scope.account),
    ("POST", "/admin/keys"): Rule(TENANT_WRITERS, "keys.create", Scope.body_owner),
    ("GET", "/admin/keys"): Rule(EVERYONE, "keys.list", Scope.query_owner),
    ("DELETE", "/admin/keys/{id}"): Rule(TENANT_WRITERS, "keys.revoke", Scope.key),
    ("PATCH", "/admin/{kind:str}/{id}"): Rule(TENANT_WRITERS, "update", Scope.record),
    ("GET", "/admin/usage"): Rule(EVERYONE, "usage.read", Scope.query_owner),
    ("GET", "/admin/me"): Rule(EVERYONE, "me.read"),
    ("POST", "/admin/keys/{id}/rotate"): Rule(TENANT_WRITERS, "keys.rotate", Scope.key),
    ("POST", "/admin/admin-keys"): Rule(OWNERS, "admin-keys.create"),
    ("GET", "/admin/admin-keys"): Rule(OWNERS, "admin-keys.list"),
    ("DELETE", "/admin/admin-keys/{id}"): Rule(OWNERS, "admin-keys.revoke", Scope.admin_key),
    ("GET", "/admin/audit"): Rule(READERS, "audit.read"),
    ("GET", "/admin/prices"): Rule(EVERYONE, "prices.list"),
    ("PUT", "/admin/prices/{model:path}"): Rule(STAFF, "prices.set"),
    ("POST", "/admin/accounts/{id}/balance"): Rule(STAFF, "balance.adjust", Scope.account),
    ("GET", "/admin/accounts/{id}/balance"): Rule(EVERYONE, "balance.read", Scope.account),
    ("GET", "/admin/usage/unit-cost"): Rule(READERS, "unit-cost.read"),
    ("GET", "/admin/accounts/{id}/requests"): Rule(EVERYONE, "requests.read", Scope.account),
    ("GET", "/admin/batches"): Rule(EVERYONE, "batches.list", Scope.query_owner),
}
KINDS = {"accounts": Scope.account, "sub-accounts": Scope.sub_account, "keys": Scope.key}
NOUNS = {Scope.account: "account", Scope.sub_account: "sub-account", Scope.key: "key", Scope.admin_key: "admin key"}


def rule_for(method: str, path: str) -> Rule:
    """The route's row; a HEAD request, which has none, is for owners and operators."""
    return RULES.get((method, path)) or Rule(STAFF, f"{method} {path}")


@dataclass(slots=True, frozen=True)
class Caller:
    id: str  # the admin key's id, or "bootstrap"
    role: Role
    account_id: str | None = None  # the one account an account admin manages

    @property
    def tenant(self) -> str | None:
        """The account this caller is confined to; None for the platform's own roles."""
        return self.account_id if self.role is Role.account_admin else None


def caller_of(request: Request) -> Caller:
    """The authorized caller of an admin route (set by AdminAccess.authorize)."""
    caller: Caller = request.state.admin_caller
    return caller


@dataclass(slots=True)
class Target:
    """What an admin call touches: its id and the record as it was before the call, for the audit log."""

    id: str | None = None
    before: Any = None


class AdminAccess:
    def __init__(self, quota: QuotaService, admin_key: str | None) -> None:
        self._quota = quota
        self._admin_key = admin_key

    async def caller(self, request: Request) -> Caller:
        """The configured admin key (an owner) or a live admin key; 401 for anything else."""
        token = bearer_token(request)
        if token is not None and self._admin_key and hmac.compare_digest(token.encode(), self._admin_key.encode()):
            return Caller(BOOTSTRAP, Role.owner)
        key = None if token is None else await self._quota.admin_keys.authenticate(token)
        if key is None:
            raise ApiError(401, "incorrect admin key", "invalid_request_error", "invalid_admin_key")
        return Caller(key.id, key.role, key.account_id)

    async def authorize(self, request: Request, rule: Rule, read_body: BodyReader) -> Target:
        """Raises 401, 403 (role not allowed) or 404 (tenant data of another account, told apart from
        nothing); returns the target the call touches."""
        caller = await self.caller(request)
        request.state.admin_caller = caller
        if caller.role not in rule.roles:
            raise forbidden(f"the {caller.role} role may not call {request.method} {request.url.path}",
                            "admin_role_forbidden")
        scope = rule.scope
        if scope is Scope.record:
            scope = KINDS.get(request.path_params.get("kind", ""), Scope.none)
        target = Target(request.path_params.get("id"))
        body = await read_body() if caller.tenant and request.method in ("POST", "PATCH", "PUT") else None
        if caller.tenant and rule.scope is Scope.record and scope is Scope.none:
            raise NotFound(f"no admin collection {request.path_params.get('kind')!r}")
        if scope in NOUNS and (caller.tenant or request.method not in ("GET", "HEAD")):  # a read needs no "before"
            target.before, owner = await self._record(scope, str(target.id))
            self._check_tenant(caller, owner, NOUNS[scope], str(target.id))
            if caller.tenant and rule.scope is Scope.record and scope is Scope.account:
                raise forbidden("an account admin may not change its own account", "admin_role_forbidden")
        elif scope is Scope.body_owner and caller.tenant:
            await self._check_named(caller, body or {})
        elif scope is Scope.query_owner and caller.tenant:
            await self._check_named(caller, dict(request.query_params))
        if caller.tenant and body and "quota" in body:
            await self._check_ceiling(caller.tenant, body["quota"])
        return target

    async def _record(self, scope: Scope, record_id: str) -> tuple[Any, str | None]:
        """(the record, the account it belongs to); NotFound when there is none."""
        admin = self._quota.admin
        if scope is Scope.account:
            account = await admin.get_account(record_id)
            return account, account.id
        if scope is Scope.sub_account:
            sub = await admin.get_sub_account(record_id)
            return sub, sub.account_id
        if scope is Scope.key:
            key = await admin.get_key(record_id)
            return key, key.account_id
        return await self._quota.admin_keys.get(record_id), None

    @staticmethod
    def _check_tenant(caller: Caller, owner: str | None, noun: str, record_id: str) -> None:
        # the same answer as for an id that does not exist, so that other tenants' ids cannot be probed
        if caller.tenant and owner != caller.tenant:
            raise NotFound(f"no {noun} {record_id!r}")

    async def _check_named(self, caller: Caller, named: dict[str, Any]) -> None:
        """Every account, sub-account or key a body or query names must be the caller's."""
        for field, scope in (("account_id", Scope.account), ("sub_account_id", Scope.sub_account),
                             ("key_id", Scope.key)):
            value = named.get(field)
            if isinstance(value, str):
                try:
                    _, owner = await self._record(scope, value)
                except NotFound:
                    owner = None
                self._check_tenant(caller, owner, NOUNS[scope], value)

    async def _check_ceiling(self, account_id: str, quota: Any) -> None:
        """An account admin's sub-accounts and keys stay within the account's own limits."""
        limits = (await self._quota.admin.get_account(account_id)).quota.to_dict()
        asked = Quota.from_dict(quota).to_dict() if isinstance(quota, dict) else {}
        for name, value in asked.items():
            limit = limits.get(name)
            if isinstance(value, int) and isinstance(limit, int) and value > limit:
                raise invalid_request(f"quota.{name} {value} exceeds the account's limit ({name} {limit})",
                                      f"quota.{name}")
