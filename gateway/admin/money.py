"""The admin API's money routes: prices, prepaid balances, and usage reports with cost (JSON or CSV)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from config.gateway import ModelPrice
from gateway.admin.body import json_body, reject_unknown
from gateway.channels.router import Router
from gateway.errors import invalid_request
from quota import (
    MAX_LISTED,
    Price,
    QuotaService,
    balance_json,
    check_granularity,
    from_micro,
    grouped,
    parse_group_by,
    parse_price,
    price_json,
    report_csv,
    report_json,
    unit_costs,
    unit_costs_by_model,
)

Handler = Callable[[Request], Awaitable[Any]]
EPOCH_DAY = date(1970, 1, 1).toordinal()
USAGE_FILTERS = ("account_id", "sub_account_id", "key_id", "model", "start", "end")
USAGE_QUERY = {*USAGE_FILTERS, "granularity", "group_by", "format"}
UNIT_COSTS = {"channel": unit_costs, "model": unit_costs_by_model}


class AdminMoney:
    """Handlers of the admin API's money routes (its admin-key check and error mapping apply to each)."""

    def __init__(self, quota: QuotaService, router: Router, currency: str) -> None:
        self._quota = quota
        self._router = router
        self._currency = currency

    def handlers(self) -> dict[str, Handler]:
        """The handlers by their action in the admin route table (gateway.admin.access.RULES)."""
        return {"prices.list": self.list_prices, "prices.set": self.set_price, "balance.adjust": self.top_up,
                "balance.read": self.balance, "unit-cost.read": self.unit_cost, "requests.read": self.requests}

    async def list_prices(self, request: Request) -> Any:
        return {"object": "list", "currency": self._currency,
                "data": [price_json(p) for p in await self._quota.money.prices()]}

    async def set_price(self, request: Request) -> Any:
        price = await self._quota.money.set_price(request.path_params["model"], await json_body(request))
        return {**price_json(price), "currency": self._currency}

    async def top_up(self, request: Request) -> Any:
        account_id = request.path_params["id"]
        entry = await self._quota.money.top_up(account_id, await json_body(request))
        return 201, {"account_id": account_id, "currency": self._currency, **entry.to_json()}

    async def balance(self, request: Request) -> Any:
        account_id = request.path_params["id"]
        balance, journal = await self._quota.money.balance(account_id)
        return {**balance_json(account_id, balance, journal), "currency": self._currency}

    async def requests(self, request: Request) -> Any:
        """The account's per-request audit records of one UTC day (`day=YYYY-MM-DD`, default today)."""
        q = request.query_params
        reject_unknown(dict(q), {"day", "limit"})
        try:
            day = date.fromisoformat(q["day"]) if "day" in q else datetime.now(UTC).date()
            limit = int(q.get("limit", "1000"))
        except ValueError:
            raise invalid_request("day must be YYYY-MM-DD and limit an integer") from None
        if not 1 <= limit <= MAX_LISTED:
            raise invalid_request(f"limit must be from 1 to {MAX_LISTED}", "limit")
        records = await self._quota.money.requests(request.path_params["id"], day.toordinal() - EPOCH_DAY, limit)
        return {"object": "list", "currency": self._currency, "data": [r.to_json() for r in records]}

    async def usage(self, request: Request, tenant: str | None = None) -> Any:
        """Without group_by, format or a month granularity: the ledger's own rows, as before money was kept.
        `tenant`: the one account an account admin may read."""
        q = request.query_params
        reject_unknown(dict(q), USAGE_QUERY)
        granularity = check_granularity(q.get("granularity", "hour"))
        filters: dict[str, Any] = {name: q[name] for name in USAGE_FILTERS if name in q}
        if tenant:
            filters["account_id"] = tenant
        ledger = "day" if granularity == "month" else granularity
        report = await self._quota.admin.usage(**filters, granularity=ledger)
        if not {"group_by", "format"} & set(q) and granularity != "month":
            listed = [{**_row_json(r), "cost": from_micro(r.cost)} for r in report.rows]
            return {"rows": listed, "prompt_tokens": report.prompt_tokens,
                    "completion_tokens": report.completion_tokens, "requests": report.requests,
                    "cost": from_micro(report.cost), "currency": self._currency}
        group_by = parse_group_by(q.get("group_by"))
        rows = grouped(report.rows, group_by, granularity)
        if q.get("format", "json") == "csv":
            return Response(report_csv(rows, group_by), media_type="text/csv")
        if q.get("format", "json") != "json":
            raise invalid_request("format must be json or csv", "format")
        return report_json(rows, self._currency)

    async def unit_cost(self, request: Request) -> Any:
        """What a million tokens cost on own channels per day: running cost over the tokens served, per channel
        or (`by=model`) per model, each channel's running cost split over its models by token share."""
        q = request.query_params
        reject_unknown(dict(q), {"start", "end", "by"})
        by = q.get("by", "channel")
        if by not in UNIT_COSTS:
            raise invalid_request("by must be channel or model", "by")
        report = await self._quota.admin.usage(start=q.get("start"), end=q.get("end"), granularity="day")
        costs = {c.name: c.config.cost_per_hour for c in self._router.channels}
        return {"object": "list", "currency": self._currency, "by": by, "data": UNIT_COSTS[by](report.rows, costs)}


def _row_json(row: Any) -> dict[str, Any]:
    return {"period_start": row.period_start.isoformat(), "account_id": row.account_id,
            "sub_account_id": row.sub_account_id, "key_id": row.key_id, "model": row.model, "channel": row.channel,
            "prompt_tokens": row.prompt_tokens, "cached_tokens": row.cached_tokens,
            "completion_tokens": row.completion_tokens, "requests": row.requests}


def seed_prices(prices: dict[str, ModelPrice]) -> list[Price]:
    """The config's prices, in force since ever (a price set through the admin API later wins)."""
    return [parse_price(model, {"input": p.input, "cached_input": p.input if p.cached_input is None
                                else p.cached_input, "output": p.output}, 0.0) for model, p in prices.items()]
