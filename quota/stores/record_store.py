"""A kind of named record that every gateway replica shares (MCP servers): JSON bodies by name and a version.

Every write bumps the version, so a replica polls one number to know that it must reload; the gateway validates
records before they are written and skips any it cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

Record = dict[str, Any]


@dataclass(slots=True)
class RecordSnapshot:
    version: int
    records: dict[str, Record] = field(default_factory=dict)


class RecordStore(Protocol):
    async def version(self) -> int: ...
    async def snapshot(self) -> RecordSnapshot: ...
    async def seed(self, records: dict[str, Record]) -> bool:
        """Writes the records only on the kind's first start (never seeded before); says whether it did."""
        ...
    async def put(self, name: str, record: Record) -> None: ...
    async def delete(self, name: str) -> None: ...
    async def close(self) -> None: ...
