"""What the executor reads of one step: the engine's sequences seen through the fields a step needs.

The engine's records satisfy these protocols structurally, so the executor never imports the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from backend.executor.sample.penalties import PenaltyState


class SamplingOptions(Protocol):
    """A request's sampling parameters, as the sampler reads them."""

    @property
    def greedy(self) -> bool: ...
    @property
    def temperature(self) -> float: ...
    @property
    def top_p(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def min_tokens(self) -> int: ...
    @property
    def stop_token_ids(self) -> list[int]: ...
    @property
    def penalized(self) -> bool: ...
    @property
    def presence_penalty(self) -> float: ...
    @property
    def frequency_penalty(self) -> float: ...
    @property
    def repetition_penalty(self) -> float: ...
    @property
    def logit_bias(self) -> dict[int, float]: ...
    @property
    def logprobs(self) -> int | None: ...


class TokenConstraint(Protocol):
    """A sequence's grammar, as the mask step reads it (see backend.executor.sample.token_mask)."""

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None: ...


class StepSequence(Protocol):
    """One sequence in a step: its tokens, how many have KV, its block table, how it samples, and the draft
    tokens (speculative decoding) that the step computes after its tokens and verifies."""

    generator: torch.Generator | None  # the sampler seeds it on first use
    penalty_state: PenaltyState | None  # the sampler builds it on first use, for penalized requests

    @property
    def token_ids(self) -> list[int]: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def num_completion_tokens(self) -> int: ...
    @property
    def block_table(self) -> list[int]: ...
    @property
    def draft_token_ids(self) -> list[int]: ...
    @property
    def params(self) -> SamplingOptions: ...
    @property
    def constraint(self) -> TokenConstraint | None: ...


class StepBatch(Protocol):
    """One step's work: for each sequence, the number of new tokens whose KV it computes."""

    @property
    def seqs(self) -> Sequence[StepSequence]: ...
    @property
    def num_new_tokens(self) -> list[int]: ...
