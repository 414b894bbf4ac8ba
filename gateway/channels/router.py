"""Picks a channel for a model: its group's targets (or the channels listing it), falling back to other models
when none can take the request; within a group the best tier, then weighted least-in-flight or, in
`prefix_affinity` mode, the channel that holds the request's prompt prefix within a load bound."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from config import ModelGroup, Routing
from config.model_groups import fallback_chain
from gateway.channels.affinity import PrefixAffinity, RoutedPrefix, prefix_chain
from gateway.channels.state import ChannelState

Names = frozenset[str] | set[str]


@dataclass(slots=True)
class Pick:
    """Where one attempt goes: the channel, the public model it serves (the one asked for, or a fallback) and the
    name the channel knows that model by."""

    channel: ChannelState
    model: str
    upstream_model: str


def any_model(model: str) -> bool:
    return True


class Router:
    """Routes a public model name to one channel per attempt.

    A model's targets are its group's (`model_groups`), else every channel whose `models` map lists it. Within a
    tier, two targets are drawn by weight and the one with fewer requests in flight per unit of weight wins ("power
    of two choices"): weights hold at low load, the least-loaded wins under load. In `prefix_affinity` mode (the
    top-level `routing`, or a group's own) a request with a prompt prefix goes where that prefix is cached instead,
    while the load bound allows (prefix_affinity.py). The channel list and the groups are swapped whole at run time
    (`update`), so a pick never sees half a change.
    """

    def __init__(self, channels: Iterable[ChannelState], rng: random.Random | None = None,
                 groups: Mapping[str, ModelGroup] | None = None, routing: Routing | None = None,
                 affinity: PrefixAffinity | None = None):
        self.channels = list(channels)
        self.groups = dict(groups or {})
        self.routing = routing or Routing()
        self.affinity = affinity or PrefixAffinity()
        self._rng = rng or random.Random()
        self._places: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {}  # by model, until the next update

    def update(self, channels: Iterable[ChannelState], groups: Mapping[str, ModelGroup]) -> None:
        # in place: the health checker, the breaker sync and the metrics hold this same list
        self.channels[:] = list(channels)
        self.groups = dict(groups)
        self._places = {}

    def models(self) -> list[str]:
        return sorted({m for c in self.channels for m in c.config.models} | set(self.groups))

    def serves(self, model: str) -> bool:
        return model in self.groups or any(model in c.config.models for c in self.channels)

    def routing_of(self, model: str) -> Routing:
        group = self.groups.get(model)
        return group.routing if group is not None and group.routing is not None else self.routing

    def prefix(self, model: str, body: dict[str, Any], scope: str) -> RoutedPrefix | None:
        """The chain to route `body` by, when `model` or one of its fallbacks routes by prefix; None otherwise.
        `scope` separates tenants whose prompts may not share a cache."""
        chars = [r.prefix_chars for r in map(self.routing_of, fallback_chain(model, self.groups))
                 if r.mode == "prefix_affinity"]
        if not chars:
            return None
        chain = prefix_chain(body, scope, max(chars))
        return RoutedPrefix(self.affinity, chain) if chain.links else None

    def targets(self, model: str) -> list[tuple[ChannelState, str]]:
        """(channel, upstream model) pairs that serve `model`, draining or not."""
        group = self.groups.get(model)
        if group is None:
            return [(c, c.config.models[model]) for c in self.channels if model in c.config.models]
        by_name = {c.name: c for c in self.channels}
        return [(by_name[t.channel], t.model) for t in group.targets if t.channel in by_name]

    def price_places(self, model: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Where `model` may be served, for pricing it when it has no price of its own: each channel of it and of
        its fallbacks, with the names a price there may be kept under (the public name served, the channel's public
        names of that upstream model, the upstream model). Kept per served model until the channels change."""
        places = self._places.get(model)
        if places is not None:
            return places
        places = tuple((channel.name, (served, *(p for p, up in channel.config.models.items() if up == upstream),
                                       upstream))
                       for served in fallback_chain(model, self.groups) for channel, upstream in self.targets(served))
        if self.serves(model):  # a name no channel serves is not kept: clients choose those
            self._places[model] = places
        return places

    def pick(self, model: str, exclude: Names = frozenset(), barred: Names = frozenset()) -> ChannelState | None:
        """A channel of `model`'s own targets, avoiding `exclude` while another choice exists, never `barred`."""
        found = self._pick_in(model, exclude, barred, fresh_only=False)
        return None if found is None else found.channel

    def route(self, model: str, exclude: Names = frozenset(), barred: Names = frozenset(),
              allowed: Callable[[str], bool] = any_model, prefix: RoutedPrefix | None = None) -> Pick | None:
        """A target for `model` or, when none of its targets can take it, for its first fallback that can.

        A channel not yet tried (`exclude`) anywhere in the chain comes before a retry of a tried one; `barred`
        channels are never picked; fallbacks the caller does not allow are skipped. Claims the breaker's half-open
        probe when it picks a half-open channel.
        """
        chain = [m for m in fallback_chain(model, self.groups) if m == model or allowed(m)]
        for fresh_only in (True, False):
            for served in chain:
                found = self._pick_in(served, exclude, barred, fresh_only, prefix)
                if found is not None:
                    return found
        return None

    def has_other(self, model: str, names: Names, allowed: Callable[[str], bool] = any_model) -> bool:
        """Whether a healthy channel outside `names` serves `model` or one of its allowed fallbacks."""
        return any(c.name not in names and c.healthy and not c.draining
                   for m in fallback_chain(model, self.groups) if m == model or allowed(m)
                   for c, _ in self.targets(m))

    def _pick_in(self, model: str, exclude: Names, barred: Names, fresh_only: bool,
                 prefix: RoutedPrefix | None = None) -> Pick | None:
        usable = [(c, up) for c, up in self.targets(model) if c.name not in barred and self._usable(c, model)]
        fresh = [t for t in usable if t[0].name not in exclude]
        pool = fresh if fresh_only else fresh or usable
        if not pool:
            return None
        tier = min(c.config.priority for c, _ in pool)
        channel, upstream_model = self._choose([t for t in pool if t[0].config.priority == tier], model, prefix)
        if not channel.breaker(model).acquire():
            return None
        return Pick(channel, model, upstream_model)

    @staticmethod
    def _usable(channel: ChannelState, model: str) -> bool:
        return (
            channel.healthy
            and not channel.draining
            and channel.has_room()
            and channel.breaker(model).available()
        )

    def _choose(self, tier: list[tuple[ChannelState, str]], model: str,
                prefix: RoutedPrefix | None) -> tuple[ChannelState, str]:
        if len(tier) == 1:
            return tier[0]
        routing = self.routing_of(model)
        if prefix is not None and routing.mode == "prefix_affinity":
            chain = prefix.chain.upto(routing.prefix_chars)
            if chain.links:
                return self.affinity.choose(tier, chain, routing.load_epsilon)
        weights = [c.config.weight for c, _ in tier]
        first, second = self._rng.choices(tier, weights=weights, k=2)
        if first is second:
            return first
        load_first = first[0].in_flight / first[0].config.weight
        load_second = second[0].in_flight / second[0].config.weight
        return first if load_first <= load_second else second
