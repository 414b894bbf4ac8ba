"""Speculative decoding, the engine's side: which sequences get draft tokens this step, how many, and what
the verification did to their KV and counters.

Drafts come from prompt lookup (n-gram): the last n tokens of a sequence (n from 3 down to 1) are searched
for in its prompt and output so far, and the tokens that followed the most recent earlier match are
proposed; or from a smaller draft model (`backend.engine.draft_model`). The runner computes a drafted sequence's last token and its k drafts in one chunk of 1 + k query
tokens; `backend.executor.verification` keeps the accepted prefix plus one token. Each sequence adapts its
draft length to an average of its acceptance rate and pauses when drafts do not pay; when more than
`MAX_SPECULATING_SEQS` sequences decode at once the step is compute-bound and nobody drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from backend.engine.block_pool import BlockPool
from backend.engine.draft_model import DraftKV, DraftModel, DraftView
from backend.engine.sequence import Sequence, SequenceStatus
from backend.executor.model_config import ModelConfig
from config.backend import EngineSettings

NGRAM_MAX, NGRAM_MIN = 3, 1
# Beyond this many decoding sequences a CPU step is compute-bound: extra query tokens cost their full price.
MAX_SPECULATING_SEQS = 4
EWMA_WEIGHT = 0.3  # of the newest step's acceptance rate
PAUSE_BELOW = 0.2  # acceptance rate under which drafts cost more than they save
PAUSE_STEPS, MAX_PAUSE_STEPS = 8, 128


def propose_ngram(token_ids: list[int], k: int, max_n: int = NGRAM_MAX, min_n: int = NGRAM_MIN) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the sequence's last n tokens,
    trying the longest n first; [] when none of them occurred before."""
    length = len(token_ids)
    last = token_ids[-1]
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = token_ids[length - n :]
        # the match must end before the suffix itself, and leave at least one token to propose
        for end in range(length - 2, n - 2, -1):
            if token_ids[end] == last and token_ids[end - n + 1 : end + 1] == suffix:
                return token_ids[end + 1 : end + 1 + k]
    return []


@dataclass(slots=True)
class DraftState:
    """One sequence's speculation: its current draft length and how well its drafts have done."""

    k: int
    acceptance: float = 1.0  # exponentially weighted acceptance rate of its drafted tokens
    paused_steps: int = 0  # decode steps left without drafts
    pauses: int = 0  # how often it was paused; each pause is twice as long as the one before
    draft_kv: DraftKV = field(default_factory=DraftKV)  # draft-model mode: its own KV's extent


@dataclass(slots=True)
class SpeculationStats:
    """Cumulative counters under vLLM's spec_decode names."""

    num_drafts: int = 0  # verification chunks run
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0  # accepted drafts plus the one token each verification adds


def speculates(seq: Sequence) -> bool:
    """Whether a sequence may be drafted for: not when its next token depends on per-token state that a
    verification of several positions would have to replay (grammars, penalties), nor when it reports
    logprobs or samples from a seed (a seeded request must draw the same numbers in any batch)."""
    params = seq.params
    return (seq.constraint is None and not params.penalized and params.logprobs is None
            and (params.greedy or params.seed is None))


class Speculator:
    """Proposes drafts before a step is scheduled and settles their KV after it ran."""

    def __init__(self, mode: str, num_speculative_tokens: int, pool: BlockPool,
                 draft_model: DraftModel | None = None) -> None:
        if mode == "draft" and draft_model is None:
            raise ValueError("speculative mode 'draft' needs a draft model")
        self.enabled = mode != "none"
        self.max_k = num_speculative_tokens
        self.pool = pool
        self.draft_model = draft_model
        self.stats = SpeculationStats()

    @classmethod
    def build(cls, settings: EngineSettings, pool: BlockPool, target: ModelConfig, dtype: torch.dtype
              ) -> Speculator:
        """The engine's speculator; in draft mode it loads the draft model, its KV cache as large as the pool."""
        draft = None
        if settings.speculative == "draft" and settings.speculative_model:
            draft = DraftModel.load(Path(settings.speculative_model), target, pool.num_blocks, pool.block_size,
                                    device=settings.device, dtype=dtype)
        return cls(settings.speculative, settings.num_speculative_tokens, pool, draft)

    def propose(self, running: list[Sequence]) -> list[DraftView]:
        """Set each running sequence's draft tokens for the next step (most get none). With a draft model,
        return the sequences to draft for with `run_draft_model` instead, their blocks already grown."""
        wanted: list[DraftView] = []
        if not self.enabled:
            return wanted
        decoding = []
        for seq in running:
            seq.draft_token_ids = []
            if seq.num_tokens - seq.num_computed_tokens == 1:
                decoding.append(seq)
        if len(decoding) > MAX_SPECULATING_SEQS:
            return wanted
        for seq in decoding:
            if not speculates(seq):
                continue
            state = seq.draft_state = seq.draft_state or DraftState(self.max_k)
            if state.paused_steps:
                state.paused_steps -= 1
                continue
            # the verification adds one token of its own, and no step may pass max_tokens
            k = min(state.k, seq.params.max_tokens - seq.num_completion_tokens - 1)
            if k <= 0:
                continue
            if self.draft_model is None:
                seq.draft_token_ids = propose_ngram(seq.token_ids, k)
            elif self.pool.can_grow(seq, seq.num_tokens + k, reserve=len(running)):
                self.pool.grow(seq, seq.num_tokens + k)  # the draft's KV goes where the target's will
                wanted.append(DraftView.of(seq, k))
        return wanted

    def run_draft_model(self, wanted: list[DraftView]) -> None:
        """Draft for the sequences `propose` chose, outside the engine lock: the views hold copies of what
        the draft model reads, so an abort meanwhile changes nothing it uses."""
        if wanted and self.draft_model is not None:
            self.draft_model.propose(wanted)

    def exclude_drafts(self, seqs: list[Sequence], num_new_tokens: list[int]) -> None:
        """Count only the last real token of a drafted sequence as computed when the step advances; its
        accepted drafts are counted by `settle` once they are tokens of the sequence."""
        for i, seq in enumerate(seqs):
            num_new_tokens[i] -= len(seq.draft_token_ids)

    def settle(self, seq: Sequence, emitted: int) -> None:
        """After a drafted sequence's step appended `emitted` tokens (accepted drafts plus one): mark the
        accepted drafts' KV as computed, release blocks that only rejected drafts used, and adapt."""
        drafted = len(seq.draft_token_ids)
        accepted = emitted - 1
        seq.draft_token_ids = []
        if seq.status is SequenceStatus.RUNNING:
            seq.num_computed_tokens += accepted
            self.pool.cache_full_blocks(seq)
            self.pool.shrink(seq, seq.num_tokens)
        stats = self.stats
        stats.num_drafts += 1
        stats.num_draft_tokens += drafted
        stats.num_accepted_tokens += accepted
        stats.num_emitted_tokens += emitted
        state = seq.draft_state
        if state is None:
            return
        state.acceptance += EWMA_WEIGHT * (accepted / drafted - state.acceptance)
        if state.acceptance < PAUSE_BELOW:
            state.pauses += 1
            state.paused_steps = min(PAUSE_STEPS << (state.pauses - 1), MAX_PAUSE_STEPS)
            state.acceptance = 2 * PAUSE_BELOW  # a fresh, modest start after the pause
            state.k = 1
        else:
            state.k = max(1, min(self.max_k, round(state.acceptance * self.max_k) + 1))
