"""Routing: tiers first, then weighted choice preferring fewer requests in flight."""

from __future__ import annotations

import random
from collections import Counter

from config import Breaker, Channel, Timeouts
from gateway.channels import ChannelState
from gateway.router import Router


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
