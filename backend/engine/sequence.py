"""One request's state inside the engine: its tokens, its KV blocks, its lifecycle and timestamps."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Any

from backend.engine.records import RequestTimings
from backend.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from backend.engine.spec.state import DraftState
    from backend.engine.structured_output import GrammarState
    from backend.executor.sample.batch import PenaltyState


class SequenceStatus(Enum):
    PENDING = "pending"  # a choice of an n > 1 request, waiting for its first choice's prefill to fork from
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    QUEUE_TIMEOUT = "queue_timeout"  # never reaches a Delta: the iterator raises QueueTimeout instead


_arrivals = itertools.count()


class TokenCounts:
    """The counts derived from a token list that begins with the prompt."""

    __slots__ = ()
    token_ids: list[int]
    num_prompt_tokens: int

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


class Sequence(TokenCounts):
    """A request as the scheduler sees it: prompt plus generated tokens and the blocks that hold their KV."""

    __slots__ = (
        "arrival",
        "block_hashes",
        "block_table",
        "cache_salt",
        "constraint",
        "draft_state",
        "draft_token_ids",
        "finish_reason",
        "forks",
        "generator",
        "index",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_prompt_tokens",
        "output",
        "params",
        "penalty_state",
        "priority",
        "queue_deadline",
        "request_id",
        "sink",
        "status",
        "timings",
        "token_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
        index: int = 0,
    ) -> None:
        self.request_id = request_id
        self.index = index  # which of the request's choices this sequence is
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.priority = priority
        self.cache_salt = cache_salt
        self.arrival = next(_arrivals)
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_cached_tokens = 0  # prefix-cache hit at first admission (reported as cached_tokens)
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the full blocks, in order
        self.timings = RequestTimings(queued=time.monotonic())
        self.queue_deadline: float | None = None  # monotonic time by which it must have started
        self.generator: torch.Generator | None = None
        self.constraint: GrammarState | None = None  # structured output: the grammar its tokens must follow
        self.penalty_state: PenaltyState | None = None  # token counts, for a penalized request's sampler
        self.output: Any = None  # the engine's text/stop state for this request
        self.sink: Callable[[Any], None] | None = None  # where the engine delivers deltas
        self.forks: list[Sequence] = []  # the request's other choices, forked from this one after its prefill
        self.draft_token_ids: list[int] = []  # speculative tokens the next step verifies after its last token
        self.draft_state: DraftState | None = None  # how its drafts have done (speculative decoding)

    @property
    def sort_key(self) -> tuple[int, int]:
        """Admission and preemption order: lower priority value first, then older first."""
        return (self.priority, self.arrival)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
