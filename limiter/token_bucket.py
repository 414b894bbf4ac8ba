"""The token bucket in memory, twin of token_bucket.lua: `burst` units refilled at `rate` per second."""

from __future__ import annotations


class TokenBucket:
    """Starts full; over any interval t it lets at most rate * t + burst units through.

    A cost above the burst passes when the bucket is full and leaves a debt, so that a request bigger
    than the burst is slowed, never barred. The settings may change between calls (`tune`).
    """

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = float(burst)
        self._at: float | None = None

    def tune(self, rate: float, burst: float) -> TokenBucket:
        self.rate, self.burst = rate, burst
        return self

    def level(self, now: float) -> float:
        """Tokens in the bucket at `now` (a clock going backwards mints nothing)."""
        if self._at is None or now > self._at:
            if self._at is not None:
                self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
        return self._tokens

    def wait(self, now: float, cost: float) -> float:
        """Seconds until the bucket holds enough for `cost` (0 when it does now)."""
        return max(min(cost, self.burst) - self.level(now), 0.0) / self.rate

    def take(self, now: float, cost: float) -> None:
        self._tokens = self.level(now) - cost

    def adjust(self, now: float, refund: float) -> None:
        """Gives back `refund` (negative takes more): at most full, at most one burst in debt."""
        self._tokens = max(min(self.level(now) + refund, self.burst), -self.burst)
