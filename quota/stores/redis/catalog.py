"""Tenancy records and the usage ledger in Redis, shared by every gateway replica."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from quota.admin.catalog import UsageQuery
from quota.admin.keys import AdminKey
from quota.money import Price
from quota.records import (
    QUOTA_FIELDS,
    Account,
    ApiKey,
    Level,
    Quota,
    SubAccount,
    UsageRow,
    from_json,
    to_json,
)
from quota.rules.audit import AuditQuery
from quota.rules.balance import JOURNAL_SHOWN, BalanceEntry
from quota.rules.request_audit import AuditRecord
from quota.stores.redis import keys as rk
from quota.stores.redis.client import RedisClient, RedisPipeline, multi_record_writes

LEDGER_SEPARATOR = "|"
AUDIT_PAGE = 500


def ledger_field(key_id: str, sub_account_id: str | None, model: str, channel: str = "") -> str:
    return LEDGER_SEPARATOR.join((key_id, sub_account_id or "-", model, channel))


# a top-up and its journal entry in one step, with the balance it leaves
TOP_UP = """
local balance = redis.call('HINCRBY', KEYS[1], 'balance', ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2] .. '|' .. ARGV[1] .. '|' .. balance .. '|' .. ARGV[3])
return balance
"""


class RedisCatalog:
    def __init__(self, client: RedisClient) -> None:
        self._r = client
        self._top_up = client.register_script(TOP_UP)

    async def _put(self, key: str, record: Account | SubAccount | ApiKey, quota_key: str, index: str,
                   member: str) -> None:
        # The quota first (one slot, one MULTI): a record that authenticated before its quota was written
        # would be admitted without limits where a cluster cannot write both at once.
        async with self._r.pipeline(transaction=True) as pipe:
            _write_quota(pipe, quota_key, record.quota)
            await pipe.execute()
        async with multi_record_writes(self._r) as pipe:
            pipe.set(key, json.dumps(to_json(record)))
            pipe.sadd(index, member)
            await pipe.execute()

    async def _members(self, key: str) -> list[str]:
        return sorted(str(m) for m in await self._r.smembers(key))

    async def _get(self, key: str) -> str | None:
        value = await self._r.get(key)
        return None if value is None else str(value)

    async def put_account(self, account: Account) -> None:
        quota_key = rk.level_keys(account.id, Level.account, account.id)[0]
        await self._put(rk.account_key(account.id), account, quota_key, rk.ACCOUNTS, account.id)

    async def get_account(self, account_id: str) -> Account | None:
        raw = await self._get(rk.account_key(account_id))
        return None if raw is None else from_json(Account, json.loads(raw))

    async def list_accounts(self) -> list[Account]:
        ids = await self._members(rk.ACCOUNTS)
        return [a for a in [await self.get_account(i) for i in ids] if a is not None]

    async def put_sub_account(self, sub: SubAccount) -> None:
        quota_key = rk.level_keys(sub.account_id, Level.sub_account, sub.id)[0]
        await self._put(rk.sub_account_key(sub.id), sub, quota_key, rk.subs_of(sub.account_id), sub.id)

    async def get_sub_account(self, sub_id: str) -> SubAccount | None:
        raw = await self._get(rk.sub_account_key(sub_id))
        return None if raw is None else from_json(SubAccount, json.loads(raw))

    async def list_sub_accounts(self, account_id: str) -> list[SubAccount]:
        ids = await self._members(rk.subs_of(account_id))
        return [s for s in [await self.get_sub_account(i) for i in ids] if s is not None]

    async def put_key(self, key: ApiKey, secret_hash: str | None = None) -> None:
        if secret_hash is None:
            secret_hash = await self._get(rk.key_hash_key(key.id))
            if secret_hash is None:
                raise KeyError(key.id)
        else:
            await self._r.set(rk.key_hash_key(key.id), secret_hash)
        quota_key = rk.level_keys(key.account_id, Level.key, key.id)[0]
        await self._put(rk.auth_key(secret_hash), key, quota_key, rk.keys_of(key.account_id), key.id)

    async def get_key(self, key_id: str) -> ApiKey | None:
        secret_hash = await self._get(rk.key_hash_key(key_id))
        key = None if secret_hash is None else await self.key_by_hash(secret_hash)
        if key is not None:
            used = await self._r.hget(rk.KEYS_LAST_USED, key_id)
            key.last_used_at = None if used is None else datetime.fromisoformat(str(used))
        return key

    async def key_by_hash(self, secret_hash: str) -> ApiKey | None:
        raw = await self._get(rk.auth_key(secret_hash))
        if raw is None:  # a rotated-out secret during its grace period (the pointer expires with it)
            key_id = await self._get(rk.key_grace_key(secret_hash))
            # only the secret the key's last rotation replaced: a later rotation ends every earlier grace
            latest = None if key_id is None else await self._get(rk.key_last_grace_key(key_id))
            current = None if latest != secret_hash else await self._get(rk.key_hash_key(str(key_id)))
            raw = None if current is None else await self._get(rk.auth_key(current))
        return None if raw is None else from_json(ApiKey, json.loads(raw))

    async def rotate_key(self, key: ApiKey, secret_hash: str, grace_until: datetime | None) -> None:
        """Gives the key a new secret; the old one keeps working until `grace_until` (None: not at all)."""
        old = await self._get(rk.key_hash_key(key.id))
        async with multi_record_writes(self._r) as pipe:
            pipe.set(rk.key_hash_key(key.id), secret_hash)
            pipe.set(rk.auth_key(secret_hash), json.dumps(to_json(key)))
            pipe.delete(rk.key_last_grace_key(key.id))
            if old is not None:
                pipe.delete(rk.auth_key(old))
                grace_ms = 0 if grace_until is None else int((grace_until - datetime.now(UTC)).total_seconds() * 1000)
                if grace_ms > 0:
                    pipe.set(rk.key_grace_key(old), key.id, px=grace_ms)
                    pipe.set(rk.key_last_grace_key(key.id), old, px=grace_ms)
            await pipe.execute()

    async def touch_key(self, key_id: str, when: datetime) -> None:
        await self._r.hset(rk.KEYS_LAST_USED, key_id, when.isoformat())

    async def put_admin_key(self, key: AdminKey, secret_hash: str | None = None) -> None:
        async with multi_record_writes(self._r) as pipe:
            pipe.set(rk.admin_key_key(key.id), json.dumps(key.to_json()))
            if secret_hash is not None:
                pipe.set(rk.admin_auth_key(secret_hash), key.id)
            pipe.sadd(rk.ADMIN_KEYS, key.id)
            await pipe.execute()

    async def get_admin_key(self, key_id: str) -> AdminKey | None:
        raw = await self._get(rk.admin_key_key(key_id))
        return None if raw is None else AdminKey.from_json(json.loads(raw))

    async def admin_key_by_hash(self, secret_hash: str) -> AdminKey | None:
        key_id = await self._get(rk.admin_auth_key(secret_hash))
        return None if key_id is None else await self.get_admin_key(key_id)

    async def list_admin_keys(self) -> list[AdminKey]:
        ids = await self._members(rk.ADMIN_KEYS)
        return [k for k in [await self.get_admin_key(i) for i in ids] if k is not None]

    async def append_audit(self, entry: dict[str, Any], keep_since: datetime) -> None:
        # MINID trims by the entry ids' time part: older entries than the retention are dropped
        await self._r.xadd(rk.AUDIT, {"body": json.dumps(entry)}, minid=int(keep_since.timestamp() * 1000),
                           approximate=False)

    async def read_audit(self, query: AuditQuery) -> list[dict[str, Any]]:
        low = "-" if query.since is None else str(int(query.since.timestamp() * 1000))
        high = "+"
        found: list[dict[str, Any]] = []
        while len(found) < query.limit:
            page: list[Any] = await self._r.xrevrange(rk.AUDIT, max=high, min=low, count=AUDIT_PAGE) or []
            entries = [json.loads(str(fields["body"])) for _, fields in page]
            found.extend(e for e in entries if query.matches(e))
            if len(page) < AUDIT_PAGE:
                break
            high = f"({page[-1][0]!s}"
        return found[:query.limit]

    async def list_keys(self, account_id: str | None, sub_account_id: str | None) -> list[ApiKey]:
        accounts = [account_id] if account_id else await self._members(rk.ACCOUNTS)
        keys = []
        for acct in accounts:
            for key_id in await self._members(rk.keys_of(acct)):
                key = await self.get_key(key_id)
                if key is not None and (sub_account_id is None or key.sub_account_id == sub_account_id):
                    keys.append(key)
        return keys

    async def _accounts_for(self, query: UsageQuery) -> list[str]:
        if query.account_id:
            return [query.account_id]
        if query.sub_account_id:
            sub = await self.get_sub_account(query.sub_account_id)
            return [sub.account_id] if sub else []
        if query.key_id:
            key = await self.get_key(query.key_id)
            return [key.account_id] if key else []
        return await self._members(rk.ACCOUNTS)

    async def usage(self, query: UsageQuery) -> list[UsageRow]:
        first, last = query.period_bounds()
        size = 3600 if query.granularity == "hour" else 86400
        rows: list[UsageRow] = []
        for acct in await self._accounts_for(query):
            periods = [int(str(p)) for p in await self._r.zrangebyscore(rk.ledger_index(acct, query.granularity),
                                                  "-inf" if first is None else first,
                                                  "+inf" if last is None else f"({last}")]
            async with self._r.pipeline(transaction=False) as pipe:
                for period in periods:
                    pipe.hgetall(rk.ledger_key(acct, query.granularity, period))
                hashes = await pipe.execute()
            for period, fields in zip(periods, hashes, strict=True):
                start = datetime.fromtimestamp(period * size, UTC)
                rows.extend(r for r in _ledger_rows(start, acct, fields) if query.matches(r))
        return rows

    async def put_price(self, price: Price) -> None:
        await self._r.rpush(rk.PRICES, json.dumps(asdict(price)))

    async def list_prices(self) -> list[Price]:
        return [Price(**json.loads(raw)) for raw in await self._r.lrange(rk.PRICES, 0, -1)]

    async def add_balance(self, account_id: str, amount: int, note: str, at: float) -> BalanceEntry:
        state = rk.level_keys(account_id, Level.account, account_id)[0]
        balance = await self._top_up(keys=[state, rk.balance_journal(account_id)], args=[amount, f"{at:.3f}", note])
        return BalanceEntry(at, amount, note, int(balance))

    async def requests(self, account_id: str, day: int, limit: int) -> list[AuditRecord]:
        return [AuditRecord.decode(str(line)) for line in await self._r.lrange(rk.request_records_key(account_id, day), 0,
                                                                                limit - 1)]

    async def balance(self, account_id: str) -> tuple[int | None, list[BalanceEntry]]:
        state = rk.level_keys(account_id, Level.account, account_id)[0]
        balance = await self._r.hget(state, "balance")
        raw = await self._r.lrange(rk.balance_journal(account_id), -JOURNAL_SHOWN, -1)
        return (None if balance is None else int(balance)), [BalanceEntry.decode(str(e)) for e in raw]


LEDGER_KINDS = {"p": "prompt_tokens", "c": "completion_tokens", "n": "requests", "ca": "cached_tokens",
                "$": "cost"}


def _ledger_rows(start: datetime, account_id: str, fields: dict[str, str]) -> list[UsageRow]:
    rows: dict[str, UsageRow] = {}
    for name, value in fields.items():
        group, kind = name.rsplit(LEDGER_SEPARATOR, 1)
        row = rows.get(group)
        if row is None:
            key_id, sub_id, rest = group.split(LEDGER_SEPARATOR, 2)
            model, _, channel = rest.rpartition(LEDGER_SEPARATOR) if rest.count(LEDGER_SEPARATOR) else (rest, "", "")
            row = rows[group] = UsageRow(start, account_id, None if sub_id == "-" else sub_id, key_id, model,
                                         0, 0, 0, channel=channel)
        setattr(row, LEDGER_KINDS[kind], int(value))
    return sorted(rows.values(), key=lambda r: (r.key_id, r.model))


def _write_quota(pipe: RedisPipeline, state_key: str, quota: Quota) -> None:
    """The admit script reads limits from the level's state hash (an absent field is unlimited); the same
    hash holds the budget counters, so only the quota fields are replaced."""
    pipe.hdel(state_key, *QUOTA_FIELDS, *rk.BUCKET_SETTINGS, "budget")
    limits: dict[Any, Any] = {n: v for n, v in quota.to_dict().items() if n in QUOTA_FIELDS}
    limits.update(rk.bucket_settings(quota.request_bucket, quota.token_bucket))
    if quota.budget is not None:
        limits["budget"] = quota.budget.spec()
    if limits:
        pipe.hset(state_key, mapping=limits)
