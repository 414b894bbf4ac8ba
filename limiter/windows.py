"""Window counters kept in memory: a sliding window of fixed slots, and a calendar-style fixed window."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(slots=True)
class WindowCheck:
    """The answer to "may `cost` more units enter the window now?"."""

    ok: bool
    count: int  # units already in the window, before this cost
    retry_after: float  # seconds until enough units leave for the cost to fit (0 when ok)
    reset: float  # seconds until the oldest counted unit leaves the window (0 when empty)


class SlidingWindow:
    """Counts units over the last `slots` slots of `slot_len` seconds.

    Exact at slot granularity: the sum over any `slots` consecutive slots never passes the limit,
    unlike the weighted two-window estimate that lets bursts through at window edges.
    """

    __slots__ = ("_counts", "_total", "slot_len", "slots")

    def __init__(self, slots: int = 60, slot_len: float = 1.0) -> None:
        assert slots > 0 and slot_len > 0
        self.slots = slots
        self.slot_len = slot_len
        self._counts: deque[list[int]] = deque()  # [slot index, count], oldest first
        self._total = 0

    def slot_at(self, now: float) -> int:
        return int(now // self.slot_len)

    def _expire(self, slot: int) -> None:
        while self._counts and self._counts[0][0] <= slot - self.slots:
            self._total -= self._counts.popleft()[1]

    def count(self, now: float) -> int:
        """Units inside the window at `now` (expiring the slots that have left it)."""
        slot = int(now // self.slot_len)
        if self._counts and self._counts[0][0] <= slot - self.slots:
            self._expire(slot)
        return self._total

    def reset(self, now: float) -> float:
        """Seconds until the oldest counted unit (or one added now) leaves the window."""
        oldest = self._counts[0][0] if self._counts else int(now // self.slot_len)
        return (oldest + self.slots) * self.slot_len - now

    def check(self, now: float, cost: int, limit: int) -> WindowCheck:
        used = self.count(now)
        reset = self.reset(now) if self._counts else 0.0
        if used + cost <= limit:
            return WindowCheck(True, used, 0.0, reset)
        return WindowCheck(False, used, self.retry_after(now, used + cost - limit, cost, limit), reset)

    def retry_after(self, now: float, need: int, cost: int, limit: int) -> float:
        """Seconds until `need` units have left the window; a full window when `cost` can never fit."""
        if cost > limit:
            return self.slots * self.slot_len
        freed = 0
        for slot, count in self._counts:
            freed += count
            if freed >= need:
                return max((slot + self.slots) * self.slot_len - now, 0.0)
        return self.slots * self.slot_len

    def add(self, now: float, cost: int) -> int:
        """Counts `cost` units in the current slot and returns that slot (for a later `adjust`)."""
        slot = int(now // self.slot_len)
        counts = self._counts
        if counts and counts[-1][0] == slot:
            counts[-1][1] += cost
        else:
            self._expire(slot)
            counts.append([slot, cost])
        self._total += cost
        return slot

    def adjust(self, slot: int, delta: int) -> None:
        """Corrects the count of `slot` by `delta` (a refund is negative); a slot gone from the window is ignored."""
        for entry in self._counts:
            if entry[0] == slot:
                change = max(delta, -entry[1])
                entry[1] += change
                self._total += change
                return

    @property
    def total(self) -> int:
        return self._total


class FixedWindow:
    """Counts units inside one named period (a day, a month); a new period starts from `seed`."""

    __slots__ = ("count", "period")

    def __init__(self) -> None:
        self.period: int | None = None
        self.count = 0

    def roll(self, period: int, seed: int = 0) -> bool:
        """Moves to `period`; returns True when the period changed (the caller may then seed it)."""
        if self.period == period:
            return False
        self.period = period
        self.count = seed
        return True

    def fits(self, cost: int, limit: int) -> bool:
        return self.count + cost <= limit

    def adjust(self, period: int, delta: int) -> None:
        if self.period == period:
            self.count = max(self.count + delta, 0)
