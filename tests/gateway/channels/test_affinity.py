"""prefix_affinity routing decisions: a conversation stays on the replica that holds its prefix while that replica
is within the load bound, leaves it above the bound, replicas joining or leaving move only their share of keys,
and tenants never share a prefix chain or a cache salt."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from config import Breaker, Channel, GatewaySettings, ModelGroup, Routing, Target, Timeouts
from gateway.channels.affinity import CHUNK_CHARS, PrefixAffinity, ServedChains, prefix_chain
from gateway.channels.router import Router
from gateway.channels.state import ChannelState
from gateway.path.request_extras import cache_scope_salt
from quota import KeyInfo

AFFINITY = Routing(mode="prefix_affinity", load_epsilon=0.25, prefix_chars=4096)
SYSTEM = "You are the support assistant of a large shop. " * 20  # about 1,000 characters, shared by every chat


def replicas(count: int) -> list[ChannelState]:
    return [ChannelState(Channel(name=f"r{i}", base_url="http://127.0.0.1:1/v1", models=["m"]), Timeouts(),
                         Breaker()) for i in range(count)]


def chat(turns: int, topic: str = "an order") -> dict[str, Any]:
    """A conversation's request at its `turns`-th user turn, after the earlier turns and their answers."""
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        if turn:
            messages.append({"role": "assistant", "content": f"Here is what I found about {topic}, part {turn}."})
        messages.append({"role": "user", "content": f"Question {turn} about {topic}: where is it now?"})
    return {"model": "m", "messages": messages}


def route_and_serve(router: Router, body: dict[str, Any], scope: str = "tenant-a") -> ChannelState:
    prefix = router.prefix("m", body, scope)
    assert prefix is not None
    pick = router.route("m", prefix=prefix)
    assert pick is not None
    prefix.served(pick.channel.name)
    return pick.channel


def test_a_later_turn_extends_the_chain_of_the_earlier_one() -> None:
    first, later = prefix_chain(chat(1), "s", 4096), prefix_chain(chat(4), "s", 4096)
    assert len(first.links) >= 3 and later.links[:len(first.links)] == first.links
    assert len(prefix_chain(chat(8), "s", 1024).links) == 1024 // CHUNK_CHARS  # only the leading prefix_chars


def test_a_conversation_stays_on_one_replica_below_the_bound_and_moves_above_it() -> None:
    channels = replicas(3)
    router = Router(channels, random.Random(1), routing=AFFINITY)
    for other in channels:
        other.in_flight = 2  # a busy tier: other conversations in flight everywhere
    homes = {route_and_serve(router, chat(turn)).name for turn in range(1, 6)}
    assert len(homes) == 1
    home = next(c for c in channels if c.name in homes)
    home.in_flight = 6  # above (1 + 0.25) x the mean with this request counted
    moved = route_and_serve(router, chat(6))
    assert moved is not home and router.affinity.overrides == Counter({home.name: 1})
    home.in_flight = 2
    # the replica that served the moved turn now holds the whole conversation: the next turns follow it there
    assert {route_and_serve(router, chat(turn)).name for turn in range(7, 10)} == {moved.name}


def test_a_new_conversation_goes_to_the_less_loaded_holder_of_its_system_prompt_and_stays_there() -> None:
    channels = replicas(3)
    router = Router(channels, random.Random(1), routing=AFFINITY)
    for name in ("r0", "r1"):  # earlier conversations left the shared system prompt on r0 and r1, not r2
        router.affinity.chains.served(prefix_chain(chat(2, topic=f"a refund from {name}"), "tenant-a", 4096), name)
    channels[0].in_flight, channels[1].in_flight = 3, 1
    topic = "a parcel that never arrived " * 12  # a first turn long enough to fill chunks of its own
    assert route_and_serve(router, chat(1, topic)).name == "r1"
    # its own history outweighs r0's lighter load, within the bound
    channels[0].in_flight, channels[1].in_flight, channels[2].in_flight = 1, 2, 2
    assert route_and_serve(router, chat(2, topic)).name == "r1"
    assert router.affinity.overrides == Counter()


def test_least_loaded_mode_does_not_route_by_prefix() -> None:
    router = Router(replicas(3), random.Random(1), routing=Routing(mode="least_loaded"))
    assert router.prefix("m", chat(3), "s") is None
    assert len({router.route("m").channel.name for _ in range(60)}) == 3  # type: ignore[union-attr]


def test_removing_a_replica_moves_only_its_keys_and_adding_one_takes_only_its_share() -> None:
    channels = replicas(4)
    router = Router(channels, random.Random(1), routing=AFFINITY)
    bodies = [chat(1, topic=f"order {i}") | {"messages": [{"role": "system", "content": f"Shop {i}. " + SYSTEM}]}
              for i in range(400)]

    def placement() -> list[str]:
        found = []
        for body in bodies:  # nothing is learned: the rendezvous order alone decides
            pick = router.route("m", prefix=router.prefix("m", body, "s"))
            assert pick is not None
            found.append(pick.channel.name)
        return found

    before = placement()
    assert min(Counter(before).values()) > 60  # spread over every replica
    router.update(channels[:3], {})  # r3 leaves
    after = placement()
    assert all(a == b for a, b in zip(before, after, strict=True) if a != "r3")
    assert all(a != "r3" for a in after)
    router.update(channels, {})  # r3 is back: it takes its keys, and only those
    assert placement() == before


def test_two_tenants_with_the_same_prompt_share_no_chain_and_no_cache_salt() -> None:
    router = Router(replicas(3), random.Random(1), routing=AFFINITY)
    a, b = prefix_chain(chat(3), "salt-a", 4096), prefix_chain(chat(3), "salt-b", 4096)
    assert not set(a.links) & set(b.links)
    served_a = route_and_serve(router, chat(3), "salt-a")
    assert router.affinity.chains.depths(b, {served_a.name}) == {}  # B is never steered to A's cached copy

    def salt(key_id: str, account: str, scope: str, secret: bytes = b"gateway-secret") -> str | None:
        return cache_scope_salt(KeyInfo(key_id, "", account, None, None, None, datetime.now(UTC), None, scope), secret)

    assert salt("k1", "acct-a", "account") == salt("k2", "acct-a", "account")
    assert salt("k1", "acct-a", "account") != salt("k3", "acct-b", "account")
    assert salt("k1", "acct-a", "key") != salt("k2", "acct-a", "key")
    assert salt("k1", "acct-a", "shared") is None
    assert salt("k1", "acct-a", "account") != salt("k1", "acct-a", "account", b"another-gateway")  # keyed


def test_the_learned_map_is_bounded_and_forgets_what_was_not_served_for_its_ttl() -> None:
    now = [0.0]
    chains = ServedChains(max_links=8, ttl=10.0, clock=lambda: now[0])
    chain = prefix_chain(chat(2), "s", 4096)
    chains.served(chain, "r0")
    assert len(chains) <= 8 and chains.depths(chain, {"r0", "r1"}) == {"r0": len(chain.links)}
    assert chains.depths(chain, {"r1"}) == {}  # a holder that left the tier does not count
    now[0] = 11.0
    assert chains.depths(chain, {"r0"}) == {}
    affinity = PrefixAffinity(chains)
    assert affinity.overrides == Counter()


def test_routing_is_configured_at_the_top_and_overridden_per_model_group() -> None:
    channel = {"name": "r0", "base_url": "http://127.0.0.1:1/v1", "models": ["m"]}
    settings = GatewaySettings(channels=[channel], routing={"mode": "prefix_affinity", "prefix_chars": 2048},
                               model_groups={"g": {"targets": [{"channel": "r0", "model": "m"}],
                                                   "routing": {"mode": "least_loaded"}}})
    assert settings.routing.load_epsilon == 0.25 and GatewaySettings().routing.mode == "prefix_affinity"
    groups = {"g": ModelGroup(targets=[Target(channel="r0", model="m")], routing=Routing(mode="least_loaded"))}
    router = Router(replicas(1), routing=settings.routing, groups=groups)
    assert router.routing_of("m").mode == "prefix_affinity" and router.routing_of("g").mode == "least_loaded"
    for bad in ({"mode": "random"}, {"load_epsilon": -1}, {"prefix_chars": 0}, {"spare": 1}):
        with pytest.raises(ValidationError):
            GatewaySettings(routing=bad)
