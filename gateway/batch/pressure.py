"""How many batch lines one replica keeps in flight: one more each poll while the more important classes are calm,
half as many as soon as one of them queues, its recent P95 time to first token passes the threshold, or (when
`yield_active` is set) it has that many requests in flight, so batch work fills the capacity realtime traffic
leaves and gives it back within one poll."""

from __future__ import annotations

import math
import time

from config.batch import BatchSettings
from gateway.path.priority import PriorityPool, PriorityPools

TTFT_WINDOW = 10.0  # seconds of first tokens the P95 is taken over
MIN_SAMPLES = 5  # fewer first tokens than this in the window say nothing about latency


class Pressure:
    def __init__(self, settings: BatchSettings, pools: PriorityPools, batch_class: str):
        self._settings = settings
        rank = pools.get(batch_class).rank
        self._above = [p for p in pools.pools.values() if p.rank < rank]
        self.target = 1

    def update(self) -> int:
        """The lines to keep in flight from now until the next poll."""
        if self.pressed():
            self.target //= 2
        else:
            self.target = min(self._settings.max_in_flight, self.target + 1)
        return self.target

    def pressed(self) -> bool:
        active = self._settings.yield_active
        return any(p.queued >= self._settings.yield_queued or _recent_p95(p) > self._settings.yield_ttft_seconds
                   or (active is not None and p.active >= active) for p in self._above)


def _recent_p95(pool: PriorityPool) -> float:
    since = time.monotonic() - TTFT_WINDOW
    recent = sorted(seconds for when, seconds in pool.first_tokens if when >= since)
    if len(recent) < MIN_SAMPLES:
        return 0.0
    return recent[min(len(recent) - 1, math.ceil(0.95 * len(recent)) - 1)]
