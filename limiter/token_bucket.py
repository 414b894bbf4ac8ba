"""The classic token bucket, in memory: `burst` tokens of capacity refilled at `rate` tokens per second."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class BucketTake:
    ok: bool
    remaining: float  # tokens left after this take (or now, when refused)
    retry_after: float  # seconds until `cost` tokens are there (0 when ok)


class TokenBucket:
    """Starts full; over any interval t it admits at most rate * t + burst tokens."""

    __slots__ = ("_last", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float) -> None:
        assert rate > 0 and burst > 0
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._last: float | None = None

    def take(self, now: float, cost: float = 1.0) -> BucketTake:
        if self._last is not None and now > self._last:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        if self._last is None or now > self._last:
            self._last = now
        if self._tokens >= cost:
            self._tokens -= cost
            return BucketTake(True, self._tokens, 0.0)
        wait = (cost - self._tokens) / self.rate if cost <= self.burst else float("inf")
        return BucketTake(False, self._tokens, wait)
