"""Concurrency leases in memory: a slot held by a member until released or until its TTL passes."""

from __future__ import annotations

import heapq


class LeaseSet:
    """At most `limit` live members; a member not renewed within its TTL frees its slot by itself.

    Expiries sit in a heap with lazy deletion, so counting live leases costs O(log n) per lapse.
    """

    __slots__ = ("_expiry", "_heap")

    def __init__(self) -> None:
        self._expiry: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def live(self, now: float) -> int:
        """Drops expired leases and returns how many remain."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            until, member = heapq.heappop(heap)
            if self._expiry.get(member) == until:
                del self._expiry[member]
        return len(self._expiry)

    def acquire(self, member: str, now: float, ttl: float) -> None:
        self._expiry[member] = now + ttl
        heapq.heappush(self._heap, (now + ttl, member))
        if len(self._heap) > 2 * len(self._expiry) + 64:
            # Renewals and releases leave stale entries behind; rebuild before they dominate.
            self._heap = [(until, m) for m, until in self._expiry.items()]
            heapq.heapify(self._heap)

    def renew(self, member: str, now: float, ttl: float) -> bool:
        if member not in self._expiry:
            return False
        self.acquire(member, now, ttl)
        return True

    def release(self, member: str) -> bool:
        return self._expiry.pop(member, None) is not None
