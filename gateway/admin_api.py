"""The admin API under /admin: accounts, sub-accounts, keys, quotas, usage; channels and model groups."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import fields, is_dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin_channels import channel_routes
from gateway.auth import check_admin
from gateway.channel_registry import ChannelRegistry
from gateway.errors import ApiError, invalid_request, not_found
from quota import UNSET, InvalidRequest, NotFound, Quota, QuotaService
from tidegate.request_body import decode_json, read_body

# admin writes are small records: a quota nests three levels
ADMIN_BODY_BYTES, ADMIN_BODY_TIMEOUT, ADMIN_JSON_DEPTH = 256 * 1024, 30.0, 16

Handler = Callable[[Request], Awaitable[Any]]
UPDATABLE = {
    "accounts": ("name", "quota"),
    "sub-accounts": ("name", "quota"),
    "keys": ("name", "models", "quota", "priority_class", "expires_at"),
}


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
                 priority_classes: frozenset[str] = frozenset()):
        self._admin = quota.admin
        self._registry = registry
        self._admin_key = admin_key
        self._classes = priority_classes

    def routes(self) -> list[Route]:
        r = self._wrap
        return [
            *channel_routes(r, self._registry, _json_body),  # before the generic PATCH below
            Route("/admin/accounts", r(self.create_account), methods=["POST"]),
            Route("/admin/accounts", r(self.list_accounts), methods=["GET"]),
            Route("/admin/accounts/{id}", r(self.get_account), methods=["GET"]),
            Route("/admin/accounts/{id}/sub-accounts", r(self.create_sub_account), methods=["POST"]),
            Route("/admin/accounts/{id}/sub-accounts", r(self.list_sub_accounts), methods=["GET"]),
            Route("/admin/keys", r(self.create_key), methods=["POST"]),
            Route("/admin/keys", r(self.list_keys), methods=["GET"]),
            Route("/admin/keys/{id}", r(self.revoke_key), methods=["DELETE"]),
            Route("/admin/{kind:str}/{id}", r(self.update), methods=["PATCH"]),
            Route("/admin/usage", r(self.usage), methods=["GET"]),
        ]

    def _wrap(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                check_admin(request, self._admin_key)
                status, result = 200, await handler(request)
                if isinstance(result, tuple):
                    status, result = result
                return JSONResponse(to_json(result), status_code=status)
            except ApiError as error:
                return error.response()
            except InvalidRequest as error:
                return invalid_request(str(error)).response()
            except NotFound as error:
                return not_found(str(error.args[0] if error.args else error)).response()
        return endpoint

    async def create_account(self, request: Request) -> Any:
        body = await _json_body(request)
        _reject_unknown(body, {"name", "quota"})
        return 201, await self._admin.create_account(body.get("name", ""), body.get("quota"))

    async def list_accounts(self, request: Request) -> Any:
        return {"data": await self._admin.list_accounts()}

    async def get_account(self, request: Request) -> Any:
        return await self._admin.get_account(request.path_params["id"])

    async def create_sub_account(self, request: Request) -> Any:
        body = await _json_body(request)
        _reject_unknown(body, {"name", "quota"})
        return 201, await self._admin.create_sub_account(request.path_params["id"], body.get("name", ""),
                                                         body.get("quota"))

    async def list_sub_accounts(self, request: Request) -> Any:
        await self._admin.get_account(request.path_params["id"])
        return {"data": await self._admin.list_sub_accounts(request.path_params["id"])}

    async def create_key(self, request: Request) -> Any:
        body = await _json_body(request)
        allowed = {"account_id", "sub_account_id", "name", "models", "quota", "priority_class", "expires_at"}
        _reject_unknown(body, allowed)
        self._check_class(body)
        created = await self._admin.create_key(**body)
        return 201, {**to_json(created.key), "key": created.secret}

    async def list_keys(self, request: Request) -> Any:
        q = request.query_params
        return {"data": await self._admin.list_keys(q.get("account_id"), q.get("sub_account_id"))}

    async def revoke_key(self, request: Request) -> Any:
        return await self._admin.revoke_key(request.path_params["id"])

    async def update(self, request: Request) -> Any:
        kind, record_id = request.path_params["kind"], request.path_params["id"]
        if kind not in UPDATABLE:
            raise not_found(f"no admin collection {kind!r}")
        body = await _json_body(request)
        _reject_unknown(body, set(UPDATABLE[kind]))
        changes = {name: body.get(name, UNSET) for name in UPDATABLE[kind]}
        self._check_class(body)
        if kind == "accounts":
            return await self._admin.update_account(record_id, **changes)
        if kind == "sub-accounts":
            return await self._admin.update_sub_account(record_id, **changes)
        return await self._admin.update_key(record_id, **changes)

    def _check_class(self, body: dict[str, Any]) -> None:
        """A key's class must be one this gateway serves: an unknown one would fail every request on the key."""
        value = body.get("priority_class")
        if value is not None and self._classes and (not isinstance(value, str) or value not in self._classes):
            raise invalid_request(f"priority_class must be one of {sorted(self._classes)} or null", "priority_class")

    async def usage(self, request: Request) -> Any:
        q = request.query_params
        names = ("account_id", "sub_account_id", "key_id", "model", "start", "end", "granularity")
        _reject_unknown(dict(q), set(names))
        query: dict[str, Any] = {name: q[name] for name in names if name in q}  # times parsed by quota
        return await self._admin.usage(**query)


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await read_body(request, max_bytes=ADMIN_BODY_BYTES, timeout=ADMIN_BODY_TIMEOUT)
    body = decode_json(raw or b"{}", max_depth=ADMIN_JSON_DEPTH)
    if not isinstance(body, dict):
        raise invalid_request("the body must be a JSON object")
    return body


def _reject_unknown(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise invalid_request(f"unknown fields: {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
