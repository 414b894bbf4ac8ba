"""One request as the load generator saw it, and the per-request metrics derived from its timestamps."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class MeasuredRequest:
    """Timestamps are seconds since the run started; the clock of a request starts at `scheduled`.

    `scheduled` is when the load profile meant the request to go out, `sent` when its headers actually
    left (after any wait for a pooled connection), so client-side queueing is `sent - scheduled` and is
    part of TTFT and E2EL rather than hidden from them.
    """

    index: int
    scheduled: float
    turn: int = 0  # position in its conversation; later turns are scheduled when the previous one ends
    input_tokens: int = 0  # the server's usage.prompt_tokens, else the local count
    requested_output_tokens: int | None = None
    sent: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    end: float | None = None
    output_tokens: int = 0  # the server's usage.completion_tokens, else the number of text chunks
    usage_reported: bool = False
    cached_tokens: int = 0  # the server's usage.prompt_tokens_details.cached_tokens: prompt served from its cache
    status: int | None = None  # HTTP status, None when no response arrived
    error: str | None = None  # "500", "429", "timeout", "connect_error", "stream_error", "truncated", ...
    error_detail: str = ""
    text: str = ""
    retried: bool = False  # sent again on a fresh connection after a kept-alive one turned out closed
    reused_connection: bool = False  # the last attempt went out on a pooled connection

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.scheduled

    @property
    def e2el(self) -> float:
        # vLLM's latency ends at the last text chunk, not at the [DONE] line
        return self.chunk_times[-1] - self.scheduled

    @property
    def itl(self) -> list[float]:
        times = self.chunk_times
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def tpot(self) -> float | None:
        """(E2EL - TTFT) / (output tokens - 1), undefined for a single output token."""
        if self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    @property
    def client_queue(self) -> float | None:
        return None if self.sent is None else self.sent - self.scheduled

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MeasuredRequest:
        return cls(**data)
