"""Routing: tiers first, then weighted choice preferring fewer requests in flight."""

from __future__ import annotations

import random
from collections import Counter

from config import Breaker, Channel, ModelGroup, Target, Timeouts
from gateway.channels.router import Router
from gateway.channels.state import ChannelState


def state(name: str, *, weight: float = 1, priority: int = 0, max_concurrency: int = 64) -> ChannelState:
    config = Channel(name=name, base_url="http://127.0.0.1:1/v1", models={"m": "up-m"}, weight=weight,
                     priority=priority, max_concurrency=max_concurrency)
    return ChannelState(config, Timeouts(), Breaker())


def test_weights_hold_at_low_load() -> None:
    heavy, light = state("heavy", weight=3), state("light", weight=1)
    router = Router([heavy, light], random.Random(1))
    picks = Counter(router.pick("m").name for _ in range(2000))  # type: ignore[union-attr]
    assert 0.7 < picks["heavy"] / 2000 < 0.8  # 3:1


def test_the_channel_with_fewer_in_flight_wins_under_load() -> None:
    busy, idle = state("busy"), state("idle")
    busy.in_flight = 10
    router = Router([busy, idle], random.Random(1))
    picks = Counter(router.pick("m").name for _ in range(500))  # type: ignore[union-attr]
    assert picks["idle"] > 350


def test_unhealthy_full_and_excluded_channels_are_skipped_and_tiers_fall_back() -> None:
    a, b, c = state("a"), state("b", max_concurrency=1), state("c", priority=1)
    router = Router([a, b, c], random.Random(1))
    a.healthy = False
    b.in_flight = 1
    assert router.pick("m").name == "c"  # type: ignore[union-attr]
    b.in_flight = 0
    assert router.pick("m", {"b"}).name == "c"  # type: ignore[union-attr]
    c.healthy = False
    assert router.pick("m", {"b"}).name == "b"  # type: ignore[union-attr]  # a retry may reuse the only one
    assert router.pick("other") is None
    assert router.models() == ["m"] and router.serves("m")


def test_an_excluded_channel_may_be_reused_but_a_barred_one_never() -> None:
    only = state("only")
    router = Router([only], random.Random(1))
    assert router.pick("m", {"only"}) is only  # a 5xx retry may go back to the only channel
    assert router.pick("m", {"only"}, {"only"}) is None  # a first-token timeout may not


def test_a_group_falls_back_to_an_untried_model_before_retrying_and_never_to_one_the_key_may_not_use() -> None:
    primary, spare = state("primary"), state("spare")
    groups = {"big": ModelGroup(targets=[Target(channel="primary", model="big-up")], fallbacks=["m"])}
    router = Router([primary, spare], random.Random(1), groups)
    assert (router.route("big").channel, router.route("big").model) == (primary, "big")  # type: ignore[union-attr]
    served = router.route("big", {"primary"})
    assert served is not None and served.model == "m" and served.upstream_model == "up-m"
    assert served.channel is spare  # of the fallback's targets (every channel listing "m"), the untried one
    assert router.route("big", {"primary", "spare"}).model == "big"  # type: ignore[union-attr]  # all tried: retry
    primary.draining = True
    assert router.route("big", allowed=lambda model: model == "big") is None
    assert router.models() == ["big", "m"] and router.has_other("big", {"primary"})
