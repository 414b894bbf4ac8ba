"""What a store keeps for routing: channel and model-group records, shared by every gateway replica.

Records are the JSON of the gateway's `Channel` and `ModelGroup` settings, validated by the gateway before they are
written. Every write bumps a version, so a replica polls one number to know that it must reload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

Record = dict[str, Any]


@dataclass(slots=True)
class RoutingSnapshot:
    version: int
    channels: dict[str, Record] = field(default_factory=dict)
    draining: set[str] = field(default_factory=set)
    groups: dict[str, Record] = field(default_factory=dict)


class RoutingStore(Protocol):
    async def version(self) -> int: ...
    async def snapshot(self) -> RoutingSnapshot: ...
    async def seed(self, channels: dict[str, Record], groups: dict[str, Record]) -> bool:
        """Writes the records only on the store's first start (never seeded before); says whether it did."""
        ...
    async def put_channel(self, name: str, record: Record) -> None: ...
    async def drain_channel(self, name: str) -> None: ...
    async def delete_channel(self, name: str) -> None: ...
    async def put_group(self, name: str, record: Record) -> None: ...
    async def delete_group(self, name: str) -> None: ...
    async def close(self) -> None: ...
