"""Picks a channel for a model: the best tier with a usable channel, then weighted least-in-flight."""

from __future__ import annotations

import random
from collections.abc import Iterable

from gateway.channels import ChannelState


class Router:
    """Routes a public model name to one channel per attempt.

    Within a tier, two channels are drawn by weight and the one with fewer requests in flight per unit
    of weight wins ("power of two choices"): weights hold at low load, the least-loaded wins under load.
    """

    def __init__(self, channels: Iterable[ChannelState], rng: random.Random | None = None):
        self.channels = list(channels)
        self._rng = rng or random.Random()

    def models(self) -> list[str]:
        return sorted({m for c in self.channels for m in c.config.models})

    def serves(self, model: str) -> bool:
        return any(model in c.config.models for c in self.channels)

    def pick(self, model: str, exclude: frozenset[str] | set[str] = frozenset(),
             barred: frozenset[str] | set[str] = frozenset()) -> ChannelState | None:
        """A channel that may take `model` now, avoiding `exclude` while another choice exists, never `barred`.

        Claims the breaker's half-open probe when it picks a half-open channel.
        """
        usable = [c for c in self.channels if c.name not in barred and self._usable(c, model)]
        fresh = [c for c in usable if c.name not in exclude]
        pool = fresh or usable
        if not pool:
            return None
        tier = min(c.config.priority for c in pool)
        chosen = self._choose([c for c in pool if c.config.priority == tier])
        if not chosen.breaker(model).acquire():
            return None
        return chosen

    @staticmethod
    def _usable(channel: ChannelState, model: str) -> bool:
        return (
            model in channel.config.models
            and channel.healthy
            and channel.has_room()
            and channel.breaker(model).available()
        )

    def _choose(self, tier: list[ChannelState]) -> ChannelState:
        if len(tier) == 1:
            return tier[0]
        weights = [c.config.weight for c in tier]
        first, second = self._rng.choices(tier, weights=weights, k=2)
        if first is second:
            return first
        load_first = first.in_flight / first.config.weight
        load_second = second.in_flight / second.config.weight
        return first if load_first <= load_second else second
