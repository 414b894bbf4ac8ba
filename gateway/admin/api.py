"""The admin API under /admin: accounts, sub-accounts, keys, quotas, usage; channels and model groups; admin
keys and the audit log. Every route is a row of one table with its access rule (gateway.admin.access.RULES) and
goes through one wrapper: authorization, then the handler, then an audit entry for each change."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import fields, is_dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from common.request_id import request_id as request_id_of
from config.stores import AdminLimits
from gateway.admin.access import RULES, AdminAccess, Rule, Scope, Target, caller_of, rule_for
from gateway.admin.batches import batch_handlers
from gateway.admin.body import json_body, reject_unknown
from gateway.admin.ceilings import within_account
from gateway.admin.channels import channel_handlers
from gateway.admin.mcp_servers import mcp_server_handlers
from gateway.admin.money import AdminMoney
from gateway.admin.write_limit import AdminWriteLimit
from gateway.auth import client_address
from gateway.channels.registry import ChannelRegistry
from gateway.errors import ApiError, invalid_request, not_found, unavailable
from gateway.mcp.registry import McpRegistry
from limiter import REDIS_DOWN
from quota import UNSET, AuditEntry, BatchStore, InvalidRequest, NotFound, Quota, QuotaService

Handler = Callable[[Request], Awaitable[Any]]
UPDATABLE = {
    "accounts": ("name", "quota", "timezone", "price_multiplier", "cache_scope", "models", "max_priority_class"),
    "sub-accounts": ("name", "quota"),
    "keys": ("name", "models", "quota", "priority_class", "expires_at", "allowed_ips"),
}
READS = ("GET", "HEAD")
log = logging.getLogger("tidegate.gateway")


def to_json(value: Any) -> Any:
    """Records as JSON: datetimes in ISO 8601, quotas as their set limits; a secret is never a field."""
    if isinstance(value, Quota):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    return value


class AdminApi:
    """Each route checks the admin key, calls quota's admin API and maps its errors to 400/404."""

    def __init__(self, quota: QuotaService, registry: ChannelRegistry, admin_key: str | None,
                 priority_classes: tuple[str, ...] = (), currency: str = "USD",
                 writes: AdminWriteLimit | None = None, mcp: McpRegistry | None = None,
                 batches: BatchStore | None = None):
        self._quota = quota
        self._admin = quota.admin
        self._admin_keys = quota.admin_keys
        self._audit = quota.audit
        self._money = AdminMoney(quota, registry.router, currency)
        self._registry = registry
        self._access = AdminAccess(quota, admin_key)
        self._classes = priority_classes
        self._writes = writes or AdminWriteLimit(AdminLimits().writes_per_minute, None)
        self._batches = batches
        self._mcp = mcp

    def routes(self) -> list[Route]:
        """One route per row of the route table, served by the handler its action names."""
        handlers = {**channel_handlers(self._registry, json_body), **self._handlers(), **self._money.handlers(),
                    **batch_handlers(self._batches)}
        if self._mcp is not None:
            handlers.update(mcp_server_handlers(self._mcp, json_body))
        assert set(handlers) == {rule.action for rule in RULES.values()}, "each handler has one row and no more"
        return [Route(path, self._wrap(handlers[rule.action]), methods=[method])
                for (method, path), rule in RULES.items()]

    def _handlers(self) -> dict[str, Handler]:
        return {"accounts.create": self.create_account, "accounts.list": self.list_accounts,
                "accounts.read": self.get_account, "sub-accounts.create": self.create_sub_account,
                "sub-accounts.list": self.list_sub_accounts, "keys.create": self.create_key,
                "keys.list": self.list_keys, "keys.revoke": self.revoke_key, "keys.rotate": self.rotate_key,
                "update": self.update, "usage.read": self.usage, "me.read": self.me,
                "admin-keys.create": self.create_admin_key, "admin-keys.list": self.list_admin_keys,
                "admin-keys.revoke": self.revoke_admin_key, "audit.read": self.audit}

    def _wrap(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            request_id = request_id_of(request.headers)
            try:
                route = request.scope.get("route")
                rule = rule_for(request.method, getattr(route, "path", request.url.path))
                target = await self._access.authorize(request, rule, lambda: json_body(request))
                if request.method not in READS:
                    await self._writes.hit(caller_of(request).id)
                status, result = 200, await handler(request)
                if isinstance(result, Response):  # a report as CSV
                    return result
                if isinstance(result, tuple):
                    status, result = result
                body = to_json(result)
                if request.method not in READS:
                    await self._audit_change(request, rule, target, body, request_id)
                return JSONResponse(body, status_code=status, headers={"x-request-id": request_id})
            except ApiError as error:
                return error.response(request_id)
            except InvalidRequest as error:
                return invalid_request(str(error)).response(request_id)
            except NotFound as error:
                return not_found(str(error.args[0] if error.args else error)).response(request_id)
            except REDIS_DOWN as error:  # the store is out of reach: the caller may retry, it is not a bug
                log.warning("admin %s %s: the store is unreachable (%s) request_id=%s", request.method,
                            request.url.path, type(error).__name__, request_id)
                return unavailable("the store is unavailable; retry shortly", 1.0,
                                   "store_unavailable").response(request_id)
        return endpoint

    async def _audit_change(self, request: Request, rule: Rule, target: Target, after: Any, request_id: str) -> None:
        caller, params = caller_of(request), request.path_params
        action = f"{params['kind']}.update" if rule.scope is Scope.record else rule.action
        target_id, before = target.id or next(iter(params.values()), None), to_json(target.before)
        if action.endswith(".create") and isinstance(after, dict):  # the new record, not its parent
            target_id, before = after.get("id", target_id), None
        await self._audit.append(AuditEntry(caller.id, caller.role, action, target_id, before, after, request_id,
                                            client_address(request)))

    async def create_account(self, request: Request) -> Any:
        body = await json_body(request)
        reject_unknown(body, set(UPDATABLE["accounts"]))
        self._check_class(body)
        return 201, await self._admin.create_account(body.get("name", ""), body.get("quota"),
                                                     body.get("timezone", "UTC"), body.get("price_multiplier", 1.0),
                                                     body.get("cache_scope", "account"), body.get("models"),
                                                     body.get("max_priority_class"))

    async def list_accounts(self, request: Request) -> Any:
        tenant = caller_of(request).tenant
        if tenant:
            return {"data": [await self._admin.get_account(tenant)]}
        return {"data": await self._admin.list_accounts()}

    async def get_account(self, request: Request) -> Any:
        return await self._admin.get_account(request.path_params["id"])

    async def create_sub_account(self, request: Request) -> Any:
        body = await json_body(request)
        reject_unknown(body, {"name", "quota"})
        return 201, await self._admin.create_sub_account(request.path_params["id"], body.get("name", ""),
                                                         body.get("quota"))

    async def list_sub_accounts(self, request: Request) -> Any:
        await self._admin.get_account(request.path_params["id"])
        return {"data": await self._admin.list_sub_accounts(request.path_params["id"])}

    async def create_key(self, request: Request) -> Any:
        body = await json_body(request)
        allowed = {"account_id", "sub_account_id", "name", "models", "quota", "priority_class", "expires_at",
                   "allowed_ips"}
        reject_unknown(body, allowed)
        self._check_class(body)
        if caller_of(request).tenant:
            body = await within_account(self._quota, str(caller_of(request).tenant), body, self._classes, True)
        created = await self._admin.create_key(**body)
        return 201, {**to_json(created.key), "key": created.secret}

    async def list_keys(self, request: Request) -> Any:
        q = request.query_params
        account_id = caller_of(request).tenant or q.get("account_id")  # the access check vetted a named one
        return {"data": await self._admin.list_keys(account_id, q.get("sub_account_id"))}

    async def revoke_key(self, request: Request) -> Any:
        return await self._admin.revoke_key(request.path_params["id"])

    async def update(self, request: Request) -> Any:
        kind, record_id = request.path_params["kind"], request.path_params["id"]
        if kind not in UPDATABLE:
            raise not_found(f"no admin collection {kind!r}")
        body = await json_body(request)
        reject_unknown(body, set(UPDATABLE[kind]))
        self._check_class(body)
        if kind == "keys" and caller_of(request).tenant:
            body = await within_account(self._quota, str(caller_of(request).tenant), body, self._classes, False)
        changes = {name: body.get(name, UNSET) for name in UPDATABLE[kind]}
        if kind == "accounts":
            return await self._admin.update_account(record_id, **changes)
        if kind == "sub-accounts":
            return await self._admin.update_sub_account(record_id, **changes)
        return await self._admin.update_key(record_id, **changes)

    def _check_class(self, body: dict[str, Any]) -> None:
        """A key's class must be one this gateway serves: an unknown one would fail every request on the key."""
        for name in ("priority_class", "max_priority_class"):
            value = body.get(name)
            if value is not None and self._classes and (not isinstance(value, str) or value not in self._classes):
                raise invalid_request(f"{name} must be one of {sorted(self._classes)} or null", name)

    async def usage(self, request: Request) -> Any:
        return await self._money.usage(request, caller_of(request).tenant)

    async def me(self, request: Request) -> Any:
        caller = caller_of(request)
        return {"id": caller.id, "role": caller.role, "account_id": caller.account_id}

    async def rotate_key(self, request: Request) -> Any:
        body = await json_body(request)
        reject_unknown(body, {"grace_seconds"})
        created = await self._admin.rotate_key(request.path_params["id"], body.get("grace_seconds", 0))
        return {**to_json(created.key), "key": created.secret}

    async def create_admin_key(self, request: Request) -> Any:
        body = await json_body(request)
        reject_unknown(body, {"role", "account_id", "name"})
        created = await self._admin_keys.create(body.get("role"), body.get("account_id"), body.get("name", ""))
        return 201, {**created.key.to_json(), "key": created.secret}

    async def list_admin_keys(self, request: Request) -> Any:
        return {"data": [key.to_json() for key in await self._admin_keys.list()]}

    async def revoke_admin_key(self, request: Request) -> Any:
        return (await self._admin_keys.revoke(request.path_params["id"])).to_json()

    async def audit(self, request: Request) -> Any:
        q = dict(request.query_params)
        reject_unknown(q, {"actor", "action", "since", "limit"})
        return {"data": await self._audit.read(**q)}

