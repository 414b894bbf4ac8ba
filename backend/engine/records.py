"""What goes into the engine and what comes out of it: requests, deltas with their per-token logprobs and
timings, stats. A leaf of the engine: the server reads these records without importing its behaviour.

`TokenLogprobs` is the sampler's record (the executor cannot import the engine), passed through as the sampler
built it and re-exported here, so the server never imports the executor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backend.engine.sampling_params import SamplingParams
from backend.executor.sample.sampler import TokenLogprobs

if TYPE_CHECKING:
    from backend.engine.structured_output import GrammarState


@dataclass(slots=True)
class RequestTimings:
    """time.monotonic() stamps of one request's life, for metrics."""

    queued: float
    scheduled: float | None = None  # first time it got a slot
    first_token: float | None = None
    finished: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_preemptions: int = 0


@dataclass(slots=True)
class GenerateRequest:
    """One request to the engine: prompt token ids, how to sample, and its scheduling class."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0  # lower value = more important; orders admission and preemption
    cache_salt: str | None = None  # extra prefix-cache key for tenant isolation
    constraint: GrammarState | None = None  # structured output: from Engine.grammars.state_for, one per request
    n: int = 1  # choices; they share the prompt's KV and each gets a derived seed


@dataclass(slots=True)
class Delta:
    """New output of one request from one step; the last one has a finish_reason and the timings."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" at the end
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    timings: RequestTimings | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per output token, when asked for
    index: int = 0  # which choice of the request


@dataclass(slots=True)
class Completion:
    """A whole offline result."""

    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    timings: RequestTimings
    logprobs: list[TokenLogprobs] = field(default_factory=list)

    @classmethod
    def from_deltas(cls, deltas: list[Delta]) -> Completion:
        """Join one request's deltas, the last of which is final."""
        last = deltas[-1]
        assert last.finish_reason is not None and last.timings is not None
        return cls(
            token_ids=[t for d in deltas for t in d.token_ids],
            text="".join(d.text for d in deltas),
            finish_reason=last.finish_reason,
            prompt_tokens=last.prompt_tokens,
            cached_tokens=last.cached_tokens,
            timings=last.timings,
            logprobs=[lp for d in deltas for lp in d.logprobs],
        )


@dataclass(slots=True)
class EngineStats:
    """A snapshot for /metrics and /health: load, KV usage, prefix-cache effect (in tokens), preemptions,
    speculative decoding."""

    num_running: int
    num_waiting: int
    kv_blocks_total: int
    kv_blocks_free: int
    kv_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    steps: int
    spec_draft_tokens: int = 0  # speculative decoding: draft tokens verified,
    spec_accepted_tokens: int = 0  # of which accepted,
    spec_emitted_tokens: int = 0  # and the tokens the verifications emitted (accepted plus one each)
