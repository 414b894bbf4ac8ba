"""Prefix affinity: a request's leading prompt as a chain of chunk hashes, the channel that last served each
chain, and the choice among a tier's channels by rendezvous hashing with a load bound.

A chain link covers the rendered prompt up to the end of one more chunk, so a conversation's next turn extends
the chain of its previous turn, and every request that shares a system prompt shares that prompt's links. The
backends cache prompts by prefix too: the channel that served a chain holds its KV until it evicts it.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.channels.state import ChannelState

CHUNK_CHARS = 256  # about 64 tokens: shorter than this, a shared prefix saves too little prefill to route by
MAX_CHAINS = 65_536  # links remembered; the least recently served go first
CHAIN_TTL = 600.0  # seconds unserved after which a link is forgotten: its replica has likely evicted the KV

Target = tuple[ChannelState, str]


@dataclass(slots=True, frozen=True)
class PrefixChain:
    """links[i] hashes the cache scope and the first (i + 1) x CHUNK_CHARS characters of the rendered prompt."""

    links: tuple[bytes, ...]

    def upto(self, chars: int) -> PrefixChain:
        return PrefixChain(self.links[:chars // CHUNK_CHARS])


def rendered_prompt(body: dict[str, Any]) -> str:
    """The text a chat template puts first: tools, then each message with its role; or the completion prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = [_text(body["tools"])] if body.get("tools") else []
        for message in messages:
            if isinstance(message, dict):
                parts.append(f"<|{message.get('role')}|>{_text(message.get('content'))}\n")
        return "".join(parts)
    return _text(body.get("prompt"))


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def prefix_chain(body: dict[str, Any], scope: str, max_chars: int) -> PrefixChain:
    """The chain of `body`'s prompt up to `max_chars`; `scope` (the cache salt) keeps tenants' chains apart."""
    text = rendered_prompt(body)[:max_chars].encode()
    digest = hashlib.blake2b(scope.encode(), digest_size=16).digest()
    links = []
    # full chunks only: a partial last chunk would not match the same place in a longer prompt
    for end in range(CHUNK_CHARS, len(text) + 1, CHUNK_CHARS):
        digest = hashlib.blake2b(digest + text[end - CHUNK_CHARS:end], digest_size=16).digest()
        links.append(digest)
    return PrefixChain(tuple(links))


def rendezvous_order(key: bytes, tier: Sequence[Target]) -> list[Target]:
    """The tier in the key's order of preference: weighted rendezvous (highest random weight) hashing, so that a
    channel joining or leaving moves only the keys that rank it first."""

    def score(target: Target) -> float:
        channel = target[0]
        draw = hashlib.blake2b(key + channel.name.encode(), digest_size=8).digest()
        uniform = (int.from_bytes(draw, "big") + 1) / (2**64 + 1)  # in (0, 1)
        return -channel.config.weight / math.log(uniform)

    return sorted(tier, key=score, reverse=True)


class ServedChains:
    """The channels that served each chain link, and when: bounded (least recently served links dropped first)
    and decaying (a channel that has not served a link for `ttl` seconds is no longer trusted to hold it)."""

    def __init__(self, max_links: int = MAX_CHAINS, ttl: float = CHAIN_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._links: OrderedDict[bytes, dict[str, float]] = OrderedDict()
        self._max = max_links
        self._ttl = ttl
        self._clock = clock

    def __len__(self) -> int:
        return len(self._links)

    def served(self, chain: PrefixChain, channel: str) -> None:
        now = self._clock()
        for link in chain.links:
            self._links.setdefault(link, {})[channel] = now
            self._links.move_to_end(link)
        while len(self._links) > self._max:
            self._links.popitem(last=False)

    def depths(self, chain: PrefixChain, among: set[str]) -> dict[str, int]:
        """How many leading links of `chain` each channel of `among` is still trusted to hold (absent: none)."""
        oldest = self._clock() - self._ttl
        found: dict[str, int] = {}
        for depth in range(len(chain.links), 0, -1):
            for channel, when in self._links.get(chain.links[depth - 1], {}).items():
                if channel in among and when >= oldest:
                    found.setdefault(channel, depth)
            if len(found) == len(among):
                break
        return found


class PrefixAffinity:
    """Chooses within a tier: the channel holding the longest part of the request's chain (the less loaded among
    equals), else the chain head's rendezvous choice, unless its load is above the bound; then the next in that
    order. Counts the choices the bound overrode."""

    def __init__(self, chains: ServedChains | None = None) -> None:
        self.chains = chains or ServedChains()
        self.overrides: Counter[str] = Counter()  # by the preferred channel that was passed over for load

    def choose(self, tier: Sequence[Target], chain: PrefixChain, epsilon: float) -> Target:
        order = rendezvous_order(chain.links[0], tier)
        depth = self.chains.depths(chain, {c.name for c, _ in tier})
        # Several replicas hold a tenant's system prompt once its conversations have spread: a new conversation
        # then goes to the less loaded of them, and its later turns follow the one replica holding their history.
        # Unheld, the rendezvous order alone decides, so that gateways agree and a replica leaving moves only its keys.
        def preference(ranked: tuple[int, Target]) -> tuple[int, float, int]:
            rank, (channel, _) = ranked
            held = depth.get(channel.name, 0)
            return -held, channel.in_flight / channel.config.weight if held else 0.0, rank

        order = [target for _, target in sorted(enumerate(order), key=preference)]
        chosen = next((t for t in order if _within_bound(t[0], tier, epsilon)), None)
        if chosen is None:  # the bound rounds up, so some channel is always within it; kept for safety
            chosen = min(order, key=lambda t: t[0].in_flight / t[0].config.weight)
        if chosen is not order[0]:
            self.overrides[order[0][0].name] += 1
        return chosen


def _within_bound(channel: ChannelState, tier: Sequence[Target], epsilon: float) -> bool:
    """Whether one more request keeps `channel` within (1 + epsilon) x its weighted share of the tier's load,
    the new request counted; rounded up, as in consistent hashing with bounded loads, so an idle tier takes it."""
    total = sum(c.in_flight for c, _ in tier) + 1
    weights = sum(c.config.weight for c, _ in tier)
    bound = math.ceil((1 + epsilon) * total * channel.config.weight / weights)
    return channel.in_flight + 1 <= bound


@dataclass(slots=True)
class RoutedPrefix:
    """A routed request's chain, learned as served by its channel once the request ends well."""

    affinity: PrefixAffinity
    chain: PrefixChain

    def served(self, channel: str) -> None:
        self.affinity.chains.served(self.chain, channel)
