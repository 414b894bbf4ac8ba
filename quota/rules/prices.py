"""Prices per model and channel with their effective-from history, and what a request costs in micro-units.

A price is in currency units per million tokens; it is kept as integer micro-units per million tokens, so a
request's cost (tokens x price / 10^6, times the account's multiplier) is exact integer arithmetic, rounded up
to the micro-unit once per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from quota.errors import InvalidRequest
from quota.money import MICRO, Price, from_micro, to_micro
from quota.rules.calendar import parse_time

PRICE_FIELDS = {"input", "cached_input", "output", "channel", "effective_from"}


def parse_price(model: str, body: dict[str, Any], now: float) -> Price:
    """A price from the admin API's body; `cached_input` defaults to `input`, `effective_from` to now."""
    unknown = sorted(set(body) - PRICE_FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown fields: {', '.join(unknown)}; allowed: {', '.join(sorted(PRICE_FIELDS))}")
    if not model or len(model) > 200:
        raise InvalidRequest("the model name must be 1 to 200 characters")
    for name in ("input", "output"):
        if name not in body:
            raise InvalidRequest(f"{name} is required (currency units per million tokens)")
    channel = body.get("channel")
    if channel is not None and (not isinstance(channel, str) or not channel or len(channel) > 200):
        raise InvalidRequest("channel must be a channel name or null")
    return Price(model, to_micro(body["input"], "input"), to_micro(body.get("cached_input", body["input"]),
                 "cached_input"), to_micro(body["output"], "output"), channel, _moment(body.get("effective_from"), now))


def _moment(value: object, now: float) -> float:
    moment = parse_time(value, "effective_from")
    return now if moment is None else moment.timestamp()


def price_json(price: Price) -> dict[str, Any]:
    return {"model": price.model, "channel": price.channel, "input": from_micro(price.input),
            "cached_input": from_micro(price.cached_input), "output": from_micro(price.output),
            "effective_from": datetime.fromtimestamp(price.effective_from, UTC).isoformat()}


def in_force(prices: Iterable[Price], model: str, at: float) -> tuple[Price, ...]:
    """The model's prices at `at`, one per channel (None: the model's default), the latest started one each."""
    latest: dict[str | None, Price] = {}
    for price in prices:
        if price.model == model and price.effective_from <= at:
            known = latest.get(price.channel)
            if known is None or price.effective_from >= known.effective_from:
                latest[price.channel] = price
    return tuple(latest.values())


def price_for(prices: tuple[Price, ...], channel: str | None) -> Price | None:
    """The channel's own price, else the model's default; None: the model is free."""
    default = None
    for price in prices:
        if price.channel == channel and channel is not None:
            return price
        if price.channel is None:
            default = price
    return default


def multiplier_ppm(value: float) -> int:
    return to_micro(value, "price_multiplier")


def request_cost(price: Price | None, multiplier: int, *, prompt_tokens: int, cached_tokens: int,
                 completion_tokens: int) -> int:
    """Micro-units, rounded up: cached input at its price, the rest of the prompt at the input price."""
    if price is None:
        return 0
    cached = min(cached_tokens, prompt_tokens)
    per_million = ((prompt_tokens - cached) * price.input + cached * price.cached_input
                   + completion_tokens * price.output)
    return -(-per_million * multiplier // (MICRO * MICRO))


def max_cost(prices: tuple[Price, ...], multiplier: int, *, prompt_tokens: int, max_output_tokens: int) -> int:
    """The most the request can cost on any channel: the prompt estimate uncached, every output token used."""
    return max((request_cost(p, multiplier, prompt_tokens=prompt_tokens, cached_tokens=0,
                             completion_tokens=max_output_tokens) for p in prices), default=0)


T = TypeVar("T")


class SharedRead(Generic[T]):
    """One store read for all who need it at once: a burst of admissions after the cache lapses reads once,
    and they resume in the order they arrived, so the store still sees them first come, first served."""

    def __init__(self) -> None:
        self._reads: dict[str, asyncio.Future[T]] = {}

    async def read(self, name: str, load: Callable[[], Awaitable[T]]) -> T:
        future = self._reads.get(name)
        if future is not None and future.get_loop() is not asyncio.get_running_loop():
            return await load()  # another thread's event loop is reading: this one reads alone
        if future is None:
            future = self._reads[name] = asyncio.ensure_future(load())
            future.add_done_callback(lambda done: self._reads.pop(name) if self._reads.get(name) is done else None)
        return await future


class PriceList:
    """The store's prices by model, reread at most every `ttl` seconds (a change reaches every replica within
    it); an admission looks at its model's history only."""

    def __init__(self, load: Callable[[], Awaitable[list[Price]]], ttl: float) -> None:
        self._load = load
        self._ttl = ttl
        self._by_model: dict[str, list[Price]] = {}
        self._read_at = float("-inf")
        self._shared: SharedRead[None] = SharedRead()

    async def of_model(self, model: str) -> list[Price]:
        if time.monotonic() - self._read_at >= self._ttl:
            await self._shared.read("prices", self._reload)
        return self.last_read(model)

    async def _reload(self) -> None:
        by_model: dict[str, list[Price]] = {}
        for price in await self._load():
            by_model.setdefault(price.model, []).append(price)
        self._by_model, self._read_at = by_model, time.monotonic()

    def last_read(self, model: str) -> list[Price]:
        return self._by_model.get(model, [])

    def forget(self) -> None:
        self._read_at = float("-inf")
