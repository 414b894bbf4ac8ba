"""What the executor reads of one step: the engine's sequences seen through the fields a step needs, and the
state the sampler keeps on them (`PenaltyState`).

The engine's records satisfy these protocols structurally, so the executor never imports the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


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


class PenaltyState:
    """One sequence's output-token counts and the set of its prompt tokens, as vocabulary-wide tensors."""

    __slots__ = ("counts", "in_prompt")

    def __init__(self, token_ids: list[int], num_prompt_tokens: int, vocab: int, device: torch.device) -> None:
        ids = torch.tensor(token_ids, dtype=torch.int64, device=device)
        self.counts = torch.bincount(ids[num_prompt_tokens:], minlength=vocab)[:vocab].float()
        self.in_prompt = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.in_prompt[ids[:num_prompt_tokens]] = True

    def record(self, token_id: int) -> None:
        self.counts[token_id] += 1


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
