"""Where the Redis store keeps things. Per-account state carries the hash tag `{acct:<id>}`, so one
admission or settlement script touches one Cluster slot; tenancy records are single-key values."""

from __future__ import annotations

from quota.records import Bucket, Level

SHORT = {Level.key: "k", Level.sub_account: "s", Level.account: "a"}


def tag(account_id: str) -> str:
    return f"tg:{{acct:{account_id}}}"


def level_keys(account_id: str, level: Level, level_id: str) -> list[str]:
    """The scripts' keys per level: a state hash (quota fields, budget counters, request and token
    windows) and a lease set."""
    base = f"{tag(account_id)}:{SHORT[level]}:{level_id}"
    return [f"{base}:state", f"{base}:leases"]


BUCKET_SETTINGS = ("rbr", "rbb", "tbr", "tbb")  # rate and burst of the request and token buckets


def bucket_settings(request: Bucket | None, tokens: Bucket | None) -> dict[str, float | int]:
    """The state hash's fields (limiter/token_bucket.lua) for the buckets that are set."""
    fields: dict[str, float | int] = {}
    for tag, bucket in (("rb", request), ("tb", tokens)):
        if bucket is not None:
            fields[f"{tag}r"], fields[f"{tag}b"] = bucket.rate, bucket.burst
    return fields


def settled_key(account_id: str, reservation_id: str) -> str:
    return f"{tag(account_id)}:settled:{reservation_id}"


def ledger_key(account_id: str, granularity: str, period: int) -> str:
    return f"{tag(account_id)}:usage:{granularity}:{period}"


def ledger_index(account_id: str, granularity: str) -> str:
    """A sorted set of the periods that hold usage, so that a range query reads only those."""
    return f"{tag(account_id)}:usage:{granularity}s"


def account_key(account_id: str) -> str:
    return f"tg:account:{account_id}"


def sub_account_key(sub_id: str) -> str:
    return f"tg:sub:{sub_id}"


def key_hash_key(key_id: str) -> str:
    return f"tg:key:{key_id}"


def auth_key(secret_hash: str) -> str:
    return f"tg:auth:{secret_hash}"


ACCOUNTS = "tg:accounts"
PRICES = "tg:prices"  # every price ever set, oldest first: a request keeps the one in force at its admission


def request_records_key(account_id: str, day: int) -> str:
    return f"{tag(account_id)}:requests:{day}"


def balance_journal(account_id: str) -> str:
    return f"{tag(account_id)}:balance:journal"


def subs_of(account_id: str) -> str:
    return f"tg:account:{account_id}:subs"


def keys_of(account_id: str) -> str:
    return f"tg:account:{account_id}:keys"


def key_grace_key(secret_hash: str) -> str:
    """A rotated-out secret's hash -> its key id, expiring when the grace period ends."""
    return f"tg:grace:{secret_hash}"


def key_last_grace_key(key_id: str) -> str:
    """The key's one secret still in its grace period: the pointers of earlier rotations no longer count."""
    return f"tg:key:{key_id}:grace"


KEYS_LAST_USED = "tg:keys:last_used"  # key id -> when it last authenticated (ISO 8601)


def admin_key_key(key_id: str) -> str:
    return f"tg:admin_key:{key_id}"


def admin_auth_key(secret_hash: str) -> str:
    return f"tg:admin_auth:{secret_hash}"


ADMIN_KEYS = "tg:admin_keys"
AUDIT = "tg:audit"  # a stream: entry ids are append times in ms, which the retention trims by
