"""Circuit breaker per (channel, model): opens on consecutive failures or a failure rate, half-opens on traffic."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from enum import Enum

from config import Breaker as BreakerSettings


class BreakerState(Enum):
    closed = "closed"
    open = "open"
    half_open = "half_open"


class CircuitBreaker:
    """Tracks the outcomes of one (channel, model) pair and says whether it may take a request now.

    After `cooldown` an open breaker lets exactly one live request through (half-open); its outcome
    closes or re-opens the breaker. There are no synthetic probes: a paid completion is never spent on one.
    """

    def __init__(self, settings: BreakerSettings, clock: Callable[[], float] = time.monotonic):
        self._settings = settings
        self._clock = clock
        self._state = BreakerState.closed
        self._consecutive = 0
        self._outcomes: deque[tuple[float, bool]] = deque()
        self._opened_at = 0.0
        self._probe_in_flight = False
        self.opened_count = 0
        self.opened_wall = 0.0  # time.time() of the last opening, for replicas sharing breaker state

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.open and self._clock() - self._opened_at >= self._settings.cooldown:
            return BreakerState.half_open
        return self._state

    def available(self) -> bool:
        """Whether a request may be routed here now, without claiming the half-open probe."""
        state = self.state
        return state is BreakerState.closed or (state is BreakerState.half_open and not self._probe_in_flight)

    def acquire(self) -> bool:
        """Claim the right to send one request; in half-open only the first caller gets it."""
        state = self.state
        if state is BreakerState.closed:
            return True
        if state is BreakerState.half_open and not self._probe_in_flight:
            self._state = BreakerState.half_open
            self._probe_in_flight = True
            return True
        return False

    def record(self, success: bool) -> None:
        now = self._clock()
        self._probe_in_flight = False
        self._outcomes.append((now, success))
        while self._outcomes and now - self._outcomes[0][0] > self._settings.window:
            self._outcomes.popleft()
        if success:
            self._consecutive = 0
            if self._state is not BreakerState.closed:
                self._close()
            return
        self._consecutive += 1
        if self._state is BreakerState.open:
            return  # a request sent before the breaker opened; the cooldown keeps running from then
        if self._state is BreakerState.half_open or self._should_open():
            self._open(now)

    def abandon(self) -> None:
        """The request ended without an outcome (client left): let the next request probe instead."""
        self._probe_in_flight = False

    def failure_rate(self) -> float:
        if not self._outcomes:
            return 0.0
        return sum(1 for _, ok in self._outcomes if not ok) / len(self._outcomes)

    def adopt_open(self, opened_wall: float) -> bool:
        """Take on an opening another replica published; False when this breaker already knew of it."""
        if self._state is not BreakerState.closed or opened_wall <= self.opened_wall:
            return False
        self._open(self._clock() - max(0.0, time.time() - opened_wall))
        return True

    def _should_open(self) -> bool:
        s = self._settings
        if self._consecutive >= s.consecutive_failures:
            return True
        return len(self._outcomes) >= s.min_requests and self.failure_rate() >= s.failure_rate

    def _open(self, now: float) -> None:
        self._state = BreakerState.open
        self._opened_at = now
        self.opened_wall = time.time() - (self._clock() - now)
        self.opened_count += 1

    def _close(self) -> None:
        self._state = BreakerState.closed
        self._outcomes.clear()
