"""The Redis store: every counter, record and ledger row in Redis, shared by all gateway replicas.

While Redis is out of reach, each limit class follows StoreSettings.redis_down; admissions made
locally meanwhile, and settlements that could not be written, are replayed once Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from config.stores import OnRedisDown, StoreSettings
from limiter import REDIS_DOWN, compose
from quota.admin.accounts import QuotaAdmin
from quota.admin.keys import AdminKeys
from quota.admin.money import MoneyAdmin
from quota.money import Budget, Quote, Spend
from quota.records import (
    QUOTA_FIELDS,
    Admission,
    ApiKey,
    Bucket,
    KeyInfo,
    Level,
    LimitName,
    Quota,
    RateInfo,
    Reservation,
)
from quota.rules.audit import AuditLog
from quota.rules.quotes import Places, Quoter, refused_unpriced, settled_cost
from quota.stores.local_admission import Charge, LocalAdmission, reservation_id
from quota.stores.redis import keys as rk
from quota.stores.redis.catalog import RedisCatalog, ledger_field
from quota.stores.redis.client import RedisClient, close_client, open_store_client
from quota.stores.redis.down import local_quota
from quota.stores.redis.money import MONEY_CODES, AuditLines, quota_script
from quota.stores.redis.script_batch import PackedKeys, ScriptBatcher
from quota.stores.service import QuotaService, StoreUnavailable, check_counts

LIMIT_CODES = [LimitName.rpm, LimitName.tpm, LimitName.concurrency, LimitName.tokens_per_day,
               LimitName.tokens_per_month, LimitName.request_bucket, LimitName.token_bucket]
MAX_PENDING = 1_000_000  # settlements waiting for Redis; beyond this the oldest are dropped


@dataclass(slots=True)
class _KeyPlan:
    """A key's levels and the admit script's keys for them, built once per key."""

    levels: list[tuple[Level, str]]
    keys: PackedKeys
    raw_quotas: list[str] | None = None
    charges: list[Charge] | None = None
    balance: bool = False  # the account has a prepaid balance, which only Redis can hold to account


@dataclass(slots=True)
class _Settlement:
    reservation: Reservation
    prompt_tokens: int
    completion_tokens: int
    spend: Spend = field(default_factory=Spend)
    outcome: str = "ok"


class RedisQuotaService(QuotaService):
    def __init__(self, settings: StoreSettings, client: RedisClient, clock: Callable[[], float] = time.time,
                 clock_lua: str = "") -> None:
        """`clock` and `clock_lua` (a Lua `server_time`) are for tests of calendar boundaries; `open`, which the
        gateway uses, never sets them, so production reads Redis TIME."""
        super().__init__(settings.auth_cache_ttl)
        self._settings = settings
        self._r = client
        self._catalog = RedisCatalog(client)
        self.admin = QuotaAdmin(self._catalog, on_change=self._forget, limits=settings.admin_limits)
        self.admin_keys = AdminKeys(self._catalog, self.admin)
        self.audit = AuditLog(self._catalog, settings.audit_retention_days * 86400)
        self._quoter = Quoter(self.admin.get_account, self._catalog.list_prices, settings.auth_cache_ttl, clock)
        self.money = MoneyAdmin(self._catalog, self.admin, self._quoter.forget, clock=clock)
        self._admit = client.register_script(quota_script("admit", clock_lua))
        self._settle = client.register_script(quota_script("settle", clock_lua))
        self._renew = client.register_script(compose("limiter", "renew_lease"))
        self._batch = ScriptBatcher(client)
        self._audit = AuditLines(settings.request_records_retention_days)
        self._local = LocalAdmission(settings.lease_ttl)
        self._plans: dict[str, _KeyPlan] = {}
        self._known_keys: dict[str, ApiKey] = {}  # last answer per secret hash, for a non-closed auth policy
        self._pending: deque[_Settlement] = deque(maxlen=MAX_PENDING)
        self._down_since: float | None = None
        self._last_try = 0.0
        self._flush: asyncio.Task[int] | None = None
        self._flush_lock = asyncio.Lock()

    @classmethod
    async def open(cls, settings: StoreSettings) -> RedisQuotaService:
        assert settings.redis_url
        return cls(settings, open_store_client(settings.redis_url, settings.redis_timeout))

    @property
    def degraded(self) -> bool:
        return self._down_since is not None

    def _forget(self) -> None:
        self._quoter.forget()
        self._forget_cached()

    def _mark_down(self) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
        self._last_try = time.monotonic()

    def _mark_up(self) -> None:
        if self._down_since is not None:
            self._down_since = None
            if self._pending and (self._flush is None or self._flush.done()):
                self._flush = asyncio.create_task(self.flush_pending())

    def _may_try(self) -> bool:
        """While down, one call per retry interval tries Redis; the rest go straight to the fallback."""
        if self._down_since is None:
            return True
        if time.monotonic() - self._last_try >= self._settings.redis_retry_interval:
            self._last_try = time.monotonic()
            return True
        return False

    async def _lookup_key(self, secret_hash: str) -> ApiKey | None:
        if self._may_try():
            try:
                key = await self._catalog.key_by_hash(secret_hash)
            except REDIS_DOWN:
                self._mark_down()
            else:
                self._mark_up()
                if key is not None:
                    self._known_keys[secret_hash] = key
                return key
        known = self._known_keys.get(secret_hash)
        if known is None or self._settings.redis_down.auth == OnRedisDown.fail_closed:
            raise StoreUnavailable("redis is out of reach")
        return known

    def _plan(self, key: KeyInfo) -> _KeyPlan:
        plan = self._plans.get(key.id)
        if plan is None:
            levels = key.levels()
            # Packed once: packing the keys on every admission was most of the client's CPU time.
            names = [k for level, level_id in levels for k in rk.level_keys(key.account_id, level, level_id)]
            plan = self._plans[key.id] = _KeyPlan(levels, PackedKeys(names))
        return plan

    async def admit(self, key: KeyInfo, *, model: str, estimated_tokens: int, request_id: str,
                    max_output_tokens: int = 0, places: Places = ()) -> Admission:
        check_counts(estimated_tokens=estimated_tokens, max_output_tokens=max_output_tokens)
        plan = self._plan(key)
        prompt_tokens = max(estimated_tokens - max_output_tokens, 0)
        if self._may_try():
            member = reservation_id(request_id)
            try:
                quote = await self._quoter.quote(key.account_id, model, max_output_tokens=max_output_tokens,
                                                 prompt_tokens=prompt_tokens, places=places)
                reply = await self._batch.call(self._admit, plan.keys,
                                               [estimated_tokens, int(self._settings.lease_ttl * 1000), member,
                                                quote.cost, *quote.bounds])
            except REDIS_DOWN:
                self._mark_down()
            else:
                self._mark_up()
                return refused_unpriced(
                    self._answer(plan, key, reply, member, model, estimated_tokens, request_id, quote), quote)
        quote = self._quoter.last_known(key.account_id, model, prompt_tokens=prompt_tokens,
                                        max_output_tokens=max_output_tokens, places=places)
        return refused_unpriced(self._fallback(plan, key, model, estimated_tokens, request_id, quote), quote)

    def _answer(self, plan: _KeyPlan, key: KeyInfo, reply: list[Any], member: str, model: str,
                estimated_tokens: int, request_id: str, quote: Quote) -> Admission:
        admitted, level, code, wait_ms, sec, day, month = reply[:7]
        money_at = 13 + 9 * len(plan.levels)  # after five quotas and four bucket settings per level
        money = reply[money_at:money_at + 2 * len(plan.levels)]
        charges = _charges(plan, reply[13:money_at], money[0::2])
        plan.balance = reply[money_at + 2 * len(plan.levels)] == "1"
        rate = RateInfo(*window_of(reply[7:10]), *window_of(reply[10:13]))
        if not admitted:
            limit = MONEY_CODES[code] if code in MONEY_CODES else LIMIT_CODES[code - 1]
            return Admission(False, None, plan.levels[level - 1][0], limit, wait_ms / 1000, rate)
        reservation = Reservation(
            id=member, request_id=request_id, key_id=key.id, sub_account_id=key.sub_account_id,
            account_id=key.account_id, model=model, estimated_tokens=estimated_tokens, slot=sec, day=day,
            month=month,
            tpm_levels=tuple(c.level for c in charges if c.quota.tpm is not None),
            lease_levels=tuple(c.level for c in charges if c.quota.max_concurrency is not None),
            budget_levels=tuple(c.level for c in charges
                                if c.quota.tokens_per_day is not None or c.quota.tokens_per_month is not None),
            cost=quote.cost, prices=quote.prices, multiplier=quote.multiplier,
            budget_fields=tuple(str(f) for f in money[1::2]), balance=plan.balance,
            bucket_levels=tuple(c.level for c in charges if c.quota.token_bucket is not None),
        )
        return Admission(True, reservation, rate=rate)

    def _fallback(self, plan: _KeyPlan, key: KeyInfo, model: str, estimated_tokens: int,
                  request_id: str, quote: Quote) -> Admission:
        policy, replicas = self._settings.redis_down, self._settings.gateway_replicas
        if plan.charges is None:  # never saw this key's quotas: nothing safe to enforce
            return Admission(False, degraded=True, unavailable=True)
        if plan.balance and policy.budgets != OnRedisDown.fail_open:  # a balance cannot be split over replicas
            return Admission(False, degraded=True, unavailable=True)
        charges = []
        for charge in plan.charges:
            quota = local_quota(charge.quota, policy, replicas)
            if quota is None:
                return Admission(False, degraded=True, unavailable=True)
            charges.append(Charge(charge.level, charge.id, quota))
        answer = self._local.admit(charges, key_id=key.id, model=model, estimated_tokens=estimated_tokens,
                                   request_id=request_id, quote=quote)
        answer.degraded = True
        return answer

    async def renew(self, reservation: Reservation) -> None:
        if reservation.local:
            self._local.renew(reservation)
            return
        if not reservation.lease_levels or not self._may_try():
            return
        keys = [rk.level_keys(reservation.account_id, level, level_id)[1]
                for level, level_id in reservation.levels() if level in reservation.lease_levels]
        try:
            await self._batch.call(self._renew, keys, [reservation.id, int(self._settings.lease_ttl * 1000)])
        except REDIS_DOWN:
            self._mark_down()
        else:
            self._mark_up()

    async def settle(self, reservation: Reservation, *, prompt_tokens: int, completion_tokens: int,
                     model: str, cached_tokens: int = 0, channel: str | None = None, outcome: str = "ok") -> None:
        check_counts(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cached_tokens=cached_tokens)
        reservation = replace(reservation, model=model)
        cost = settled_cost(reservation, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
                            completion_tokens=completion_tokens, channel=channel)
        if reservation.local:
            if not self._local.settle(reservation, prompt_tokens + completion_tokens, cost=cost):
                return
            # Redis's counters never held this estimate: replay only the ledger and the budgets.
            budgets = tuple(level for level, _ in reservation.levels())
            plan = self._plans.get(reservation.key_id)  # a fail-open balance still pays for what was served
            reservation = replace(reservation, estimated_tokens=0, tpm_levels=(), lease_levels=(), bucket_levels=(),
                                  budget_levels=budgets, cost=0, balance=plan is not None and plan.balance)
        work = _Settlement(reservation, prompt_tokens, completion_tokens,
                           Spend(min(cached_tokens, prompt_tokens), cost, channel or ""), outcome)
        if not self._pending and self._may_try():
            try:
                await self._write(work)
            except REDIS_DOWN:
                self._mark_down()
                self._pending.append(work)
            else:
                self._mark_up()
            return
        # Keep the order of what waits; this call may be the one that finds Redis back.
        self._pending.append(work)
        if self._may_try():
            await self.flush_pending()

    async def _write(self, work: _Settlement) -> None:
        res = work.reservation
        keys = [rk.settled_key(res.account_id, res.id),
                rk.ledger_key(res.account_id, "hour", res.slot // 3600),
                rk.ledger_key(res.account_id, "day", res.day),
                rk.ledger_index(res.account_id, "hour"), rk.ledger_index(res.account_id, "day")]
        args: list[str | int] = [res.id, res.slot, res.day, res.month, res.estimated_tokens, work.prompt_tokens,
                                 work.completion_tokens,
                                 ledger_field(res.key_id, res.sub_account_id, res.model, work.spend.channel)]
        for level, level_id in res.levels():
            keys.extend(rk.level_keys(res.account_id, level, level_id))
            args.extend((int(level in res.tpm_levels), int(level in res.lease_levels),
                         int(level in res.budget_levels)))
        fields = res.budget_fields or ("-",) * len(res.levels())
        args.extend((work.spend.cost, res.cost, work.spend.cached_tokens, int(res.balance), *fields))
        args.append("".join("1" if level in res.bucket_levels else "0" for level, _ in res.levels()))
        audit = self._audit.entry(res, work.prompt_tokens, work.completion_tokens, work.spend, work.outcome)
        if audit is not None:  # one script call settles and appends the request's line (settle.lua)
            key, line, ttl = audit
            keys.append(key)
            args.extend((line, ttl))
        await self._batch.call(self._settle, keys, args)

    async def flush_pending(self) -> int:
        """Writes settlements that waited for Redis, oldest first; returns how many are still waiting.

        One flush at a time: two would both write the head (harmless, settling is idempotent) and then
        both pop, dropping an entry that was never written.
        """
        async with self._flush_lock:
            while self._pending:
                try:
                    await self._write(self._pending[0])
                except REDIS_DOWN:
                    self._mark_down()
                    break
                self._pending.popleft()
                self._down_since = None
        return len(self._pending)

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def close(self) -> None:
        if self._flush is not None:
            with contextlib.suppress(asyncio.CancelledError, *REDIS_DOWN):
                await self._flush
        with contextlib.suppress(*REDIS_DOWN):
            await close_client(self._r)


def _charges(plan: _KeyPlan, raw: list[str], budgets: list[str]) -> list[Charge]:
    """The quotas the script read ('-' is unlimited), kept for the fallback; rebuilt only when they change."""
    if plan.raw_quotas != raw + budgets or plan.charges is None:
        plan.raw_quotas = raw + budgets
        count = len(plan.levels)
        values = [None if v == "-" else int(v) for v in raw[:count * 5]]
        buckets = [None if v == "-" else float(v) for v in raw[count * 5:count * 9]]
        plan.charges = [Charge(level, level_id, quota_of(values[i * 5:i * 5 + 5], buckets[i * 4:i * 4 + 4],
                                                       None if budgets[i] == "-" else Budget.of_spec(budgets[i])))
                        for i, (level, level_id) in enumerate(plan.levels)]
    return plan.charges


def window_of(limit_remaining_reset: list[int]) -> tuple[int | None, int | None, float | None]:
    """The admit script's reply for the tightest rate window: (limit, remaining, reset in seconds)."""
    limit, remaining, reset_ms = limit_remaining_reset
    return (None, None, None) if limit < 0 else (limit, remaining, reset_ms / 1000)


def quota_of(limits: list[int | None], buckets: list[float | None], budget: Budget | None) -> Quota:
    """A level's quota as the admit script read it: its five limits, its buckets' (rate, burst) and its budget."""
    request_rate, request_burst, token_rate, token_burst = buckets
    return replace(
        Quota(), **dict(zip(QUOTA_FIELDS, limits, strict=True)), budget=budget,
        request_bucket=None if request_rate is None or request_burst is None else Bucket(request_rate,
                                                                                          int(request_burst)),
        token_bucket=None if token_rate is None or token_burst is None else Bucket(token_rate, int(token_burst)))
