"""Reading the admit script's reply: the tightest rate windows, and each level's quota as the script read it."""

from __future__ import annotations

from dataclasses import replace

from quota.money import Budget
from quota.records import QUOTA_FIELDS, Bucket, Quota


def window_of(limit_remaining_reset: list[int]) -> tuple[int | None, int | None, float | None]:
    limit, remaining, reset_ms = limit_remaining_reset
    return (None, None, None) if limit < 0 else (limit, remaining, reset_ms / 1000)


def quota_of(limits: list[int | None], buckets: list[float | None], budget: Budget | None) -> Quota:
    """A level's quota from the script's five limits, its buckets' (rate, burst) pairs and its budget."""
    request_rate, request_burst, token_rate, token_burst = buckets
    return replace(
        Quota(), **dict(zip(QUOTA_FIELDS, limits, strict=True)), budget=budget,
        request_bucket=None if request_rate is None or request_burst is None else Bucket(request_rate,
                                                                                          int(request_burst)),
        token_bucket=None if token_rate is None or token_burst is None else Bucket(token_rate, int(token_burst)))
