"""What a store keeps for the Files and Batch APIs: file and batch records (JSON documents in OpenAI's shape plus
their owner), and per batch the lines not yet answered, each leased to one gateway replica at a time, and the one
result each line gets.

A line is leased for a few seconds and renewed while it runs, so a killed replica's lines are taken over once its
leases lapse; a result is recorded only if the line has none yet, so a line answered twice is written once.
Record writes that change a batch's status are compare-and-set on the status, so two replicas never both
finalize, expire or cancel one batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

Doc = dict[str, Any]
# a batch whose lines may still run or whose files are still to be written; the dispatcher polls only these
ACTIVE = frozenset({"validating", "in_progress", "finalizing", "cancelling"})


@dataclass(slots=True, frozen=True)
class Progress:
    unfinished: int  # lines without a result
    running: int  # of those, leased to a replica whose lease has not lapsed
    completed: int  # results that are answers
    failed: int  # results that are errors


@dataclass(slots=True, frozen=True)
class LineResult:
    index: int
    ok: bool
    line: str  # the JSON line for the output file (ok) or the error file


class BatchStore(Protocol):
    async def put_file(self, doc: Doc) -> None:
        """Writes a file record (`id`, `account_id` and `created_at` required)."""
        ...

    async def get_file(self, file_id: str) -> Doc | None: ...

    async def list_files(self, account_id: str) -> list[Doc]:
        """The account's file records, newest first."""
        ...

    async def delete_file(self, file_id: str) -> bool: ...

    async def create_batch(self, doc: Doc, lines: list[int], results: list[LineResult]) -> None:
        """Writes a batch with `lines` waiting to run and `results` already known (lines refused when read)."""
        ...

    async def get_batch(self, batch_id: str) -> Doc | None: ...

    async def list_batches(self, account_id: str) -> list[Doc]: ...

    async def active_batches(self) -> list[Doc]: ...

    async def update_batch(self, batch_id: str, expect: frozenset[str], changes: Doc) -> Doc | None:
        """Applies `changes` only while the batch's status is one of `expect`; the new record, or None."""
        ...

    async def lease(self, batch_id: str, owner: str, count: int, seconds: float) -> list[int]:
        """Up to `count` lines that are free (never leased, lease lapsed, or postponed until before now)."""
        ...

    async def renew(self, batch_id: str, owner: str, indexes: list[int], seconds: float) -> None:
        """Extends the leases `owner` still holds."""
        ...

    async def postpone(self, batch_id: str, owner: str, index: int, seconds: float) -> None:
        """Gives a leased line back, free again after `seconds` (refused for now: rate limit, overload)."""
        ...

    async def record(self, result: LineResult, batch_id: str) -> bool:
        """Records the line's result unless it has one; says whether this call did."""
        ...

    async def progress(self, batch_id: str) -> Progress: ...

    async def unfinished(self, batch_id: str) -> list[int]: ...

    async def results(self, batch_id: str) -> list[LineResult]:
        """Every recorded result, in line order."""
        ...

    async def close(self) -> None: ...
