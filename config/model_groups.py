"""Model groups: a public model name over (channel, upstream model) targets, with fallbacks to other public names."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# a request tries its own model and at most this many fallbacks, however long the chain in the store
MAX_FALLBACKS = 4


class Routing(BaseModel):
    """How a tier's channels are chosen: by load alone, or by the request's prompt prefix within a load bound."""

    model_config = ConfigDict(extra="forbid")

    # prefix_affinity since the benchmark of docs/benchmarks.md showed its win (cached share, TTFT, throughput)
    mode: Literal["least_loaded", "prefix_affinity"] = "prefix_affinity"
    # prefix_affinity: the preferred channel is passed over once its in-flight count would exceed
    # (1 + load_epsilon) x the tier's mean
    load_epsilon: float = Field(default=0.25, ge=0, le=10)
    prefix_chars: int = Field(default=4096, ge=64, le=1_000_000)  # of the rendered prompt, hashed in chunks


class Target(BaseModel):
    """One place a public model is served: a channel and the model name that channel knows it by."""

    model_config = ConfigDict(extra="forbid")

    channel: str = Field(min_length=1)
    model: str = Field(min_length=1)


class ModelGroup(BaseModel):
    """A public model name's targets, routed like channels (tier, then weight and load, or prefix affinity), and
    its fallbacks in order, tried when no target can take a request."""

    model_config = ConfigDict(extra="forbid")

    targets: list[Target] = Field(min_length=1)
    fallbacks: list[str] = Field(default_factory=list, max_length=MAX_FALLBACKS)
    routing: Routing | None = None  # None: the gateway's top-level `routing`


def group_problem(name: str, group: ModelGroup, groups: Mapping[str, ModelGroup], channels: Iterable[str],
                  implicit: Iterable[str]) -> str | None:
    """Why `group`, stored under `name` next to `groups`, would be wrong; None when it is fine.

    Targets must name known channels; fallbacks must be served models other than the group itself, and following
    fallbacks from any group must never come back to where it started.
    """
    known_channels = set(channels)
    for target in group.targets:
        if target.channel not in known_channels:
            return f"target channel {target.channel!r} does not exist"
    merged = {**groups, name: group}
    served = set(implicit) | set(merged)
    for fallback in group.fallbacks:
        if fallback not in served:
            return f"fallback {fallback!r} is not a served model"
    cycle = _cycle(merged)
    return None if cycle is None else f"fallbacks form a cycle: {' -> '.join(cycle)}"


def _cycle(groups: Mapping[str, ModelGroup]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done or node not in groups:
            return None
        for nxt in groups[node].fallbacks:
            found = visit(nxt, [*path, node])
            if found is not None:
                return found
        done.add(node)
        return None

    for start in sorted(groups):
        found = visit(start, [])
        if found is not None:
            return found
    return None


def fallback_chain(model: str, groups: Mapping[str, ModelGroup]) -> list[str]:
    """`model` and then its fallbacks, depth first, each once, at most MAX_FALLBACKS after the model itself."""
    chain: list[str] = []

    def walk(name: str) -> None:
        if name in chain or len(chain) > MAX_FALLBACKS:
            return
        chain.append(name)
        group = groups.get(name)
        for nxt in group.fallbacks if group else ():
            walk(nxt)

    walk(model)
    return chain[:MAX_FALLBACKS + 1]
