"""What each limit class becomes while Redis is out of reach (config/stores.py RedisDownPolicy)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from config.stores import OnRedisDown, RedisDownPolicy
from quota.money import Budget
from quota.records import BUCKET_FIELDS, Bucket, Quota

FIELD_CLASS = {"rpm": "rate_limits", "tpm": "rate_limits", "max_concurrency": "concurrency",
               "tokens_per_day": "budgets", "tokens_per_month": "budgets"}


def local_quota(quota: Quota, policy: RedisDownPolicy, replicas: int) -> Quota | None:
    """The quota this replica enforces alone, or None when a fail-closed limit class is set on it.

    `local` splits a limit evenly over the replicas, so that together they stay within it.
    """
    values: dict[str, Any] = {}
    for name, limit_class in FIELD_CLASS.items():
        value = getattr(quota, name)
        action = getattr(policy, limit_class)
        if value is None or action == OnRedisDown.fail_open:
            values[name] = None
        elif action == OnRedisDown.fail_closed:
            return None
        else:
            values[name] = value // replicas
    buckets: dict[str, Any] = {}
    for name in BUCKET_FIELDS:  # rate limits: a replica refills at its share of the rate
        bucket, action = getattr(quota, name), policy.rate_limits
        if bucket is not None and action == OnRedisDown.fail_closed:
            return None
        local = bucket is not None and action != OnRedisDown.fail_open
        buckets[name] = Bucket(bucket.rate / replicas, max(1, bucket.burst // replicas)) if local else None
    budget = quota.budget
    if budget is not None and policy.budgets != OnRedisDown.fail_open:
        if policy.budgets == OnRedisDown.fail_closed:
            return None
        budget = Budget(budget.amount // replicas, budget.window)
    budget = None if policy.budgets == OnRedisDown.fail_open else budget
    return replace(Quota(), **values, **buckets, budget=budget)
