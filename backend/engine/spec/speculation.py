"""Speculative decoding, the engine's side: which sequences get draft tokens this step, how many, and what
the verification did to their KV and counters.

Drafts come from prompt lookup (n-gram): the last n tokens of a sequence (n from 4 down to 1) are searched
for in its prompt and output so far, and the tokens that followed the most recent earlier match are
proposed; or from a smaller draft model (`backend.engine.spec.draft_model`). The runner computes a drafted
sequence's last token and its k drafts in one chunk of 1 + k query tokens;
`backend.executor.sample.verification` keeps the accepted prefix plus one token. How many tokens a sequence
drafts follows from its own acceptance estimates (`backend.engine.spec.state`); when more than
`MAX_SPECULATING_SEQS` sequences decode at once the step is compute-bound and nobody drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from backend.engine.block_pool import BlockPool
from backend.engine.sequence import Sequence, SequenceStatus
from backend.engine.spec.draft_model import DraftModel, DraftView
from backend.engine.spec.state import DRAFT_MODEL, DraftState
from backend.executor.model.config import ModelConfig
from config.backend import EngineSettings

NGRAM_MAX, NGRAM_MIN = 4, 1
# Beyond this many decoding sequences a CPU step is compute-bound: extra query tokens cost their full price.
MAX_SPECULATING_SEQS = 4


def propose_ngram(token_ids: list[int], k: int, max_n: int = NGRAM_MAX, min_n: int = NGRAM_MIN
                  ) -> tuple[list[int], int]:
    """Up to k tokens that followed the most recent earlier occurrence of the sequence's last n tokens,
    trying the longest n first, and that n; ([], 0) when none of them occurred before."""
    length = len(token_ids)
    if length < 2:
        return [], 0
    # Every step searches the whole history: the scan for the last token runs in C (list.index over a
    # reversed copy), and only its occurrences are compared further back in Python.
    backwards = token_ids[::-1]
    last, longest = backwards[0], min(max_n, length - 1)
    best_n, best_end, at = 0, -1, 1
    while best_n < longest:
        try:
            at = backwards.index(last, at)
        except ValueError:
            break
        end = length - 1 - at  # the match ends here, before the suffix; it may overlap it
        n = 1
        while n < longest and n <= end and token_ids[end - n] == backwards[n]:
            n += 1
        if n > best_n:  # the most recent occurrence of each length wins
            best_n, best_end = n, end
        at += 1
    if best_n < min_n:
        return [], 0
    return token_ids[best_end + 1 : best_end + 1 + k], best_n


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
    def build(cls, settings: EngineSettings, pool: BlockPool, target: ModelConfig, dtype: torch.dtype,
              kv_dtype: torch.dtype) -> Speculator:
        """The engine's speculator; in draft mode it loads the draft model (weights in `dtype`), its KV cache as
        large as the pool and of `kv_dtype`."""
        draft = None
        if settings.speculative == "draft" and settings.speculative_model:
            draft = DraftModel.load(Path(settings.speculative_model), target, pool.num_blocks, pool.block_size,
                                    device=settings.device, dtype=dtype, kv_dtype=kv_dtype)
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
            state = seq.draft_state = seq.draft_state or DraftState()
            # the verification adds one token of its own, and no step may pass max_tokens
            limit = min(self.max_k, seq.params.max_tokens - seq.num_completion_tokens - 1)
            if limit <= 0:
                continue
            if self.draft_model is None:
                proposal, n = propose_ngram(seq.token_ids, limit)
                if proposal:
                    seq.draft_token_ids = proposal[: state.draft_length(n, len(proposal), len(decoding))]
                continue
            k = state.draft_length(DRAFT_MODEL, limit, len(decoding))
            if k and self.pool.can_grow(seq, seq.num_tokens + k, reserve=len(running)):
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
        if seq.draft_state is not None:
            seq.draft_state.observe(drafted, accepted)
