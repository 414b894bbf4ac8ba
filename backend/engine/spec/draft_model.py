"""Draft-model speculation: a smaller model of the same tokenizer proposes k greedy tokens per sequence.

The draft model has a KV cache of its own, laid out like the target's and addressed by the same block ids:
a sequence's draft KV sits in the blocks its block table already names, so the pool's accounting covers
both caches. Each proposal first brings the draft's KV up to the sequence's last token (its whole prompt on
the first one), then runs k single-token greedy steps, all proposing sequences batched together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from backend.engine.host import collector_paused, in_passing_thread
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence, TokenCounts
from backend.engine.spec.state import DraftKV
from backend.executor.model.config import ModelConfig
from backend.executor.runner import ModelRunner
from backend.executor.sample.batch import PenaltyState
from backend.executor.sample.sampler import argmax_rows
from backend.loading.loader import load_model


@dataclass(slots=True)
class DraftView(TokenCounts):
    """A sequence as the draft runner sees it: its tokens plus the drafts so far, the draft's KV length, and
    its block table (copied under the engine lock: the draft model runs outside it)."""

    seq: Sequence
    token_ids: list[int]
    num_computed_tokens: int
    k: int
    block_table: list[int]
    kv: DraftKV
    num_prompt_tokens: int
    base: int  # the sequence's own tokens; the drafts follow them
    draft_token_ids: list[int] = field(default_factory=list)  # the draft model verifies nothing
    generator: torch.Generator | None = None
    penalty_state: PenaltyState | None = None
    constraint: None = None

    @classmethod
    def of(cls, seq: Sequence, k: int) -> DraftView:
        kv = _draft_kv(seq)
        return cls(seq, list(seq.token_ids), kv.num_computed_tokens, k, list(seq.block_table), kv,
                   seq.num_prompt_tokens, seq.num_tokens)

    @property
    def params(self) -> SamplingParams:
        return self.seq.params


@dataclass(slots=True)
class _DraftBatch:
    seqs: list[DraftView]
    num_new_tokens: list[int]


class DraftModel:
    """Runs the draft model's steps for a set of sequences whose blocks already cover their drafts."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    @classmethod
    def load(cls, path: Path, target: ModelConfig, num_blocks: int, block_size: int, *, device: str,
             dtype: torch.dtype, kv_dtype: torch.dtype) -> DraftModel:
        """Load the draft model with a KV cache of `num_blocks` blocks (the target's pool's block ids)."""
        with collector_paused():
            loaded = in_passing_thread(lambda: load_model(path, device=device, dtype=dtype))
        if loaded.config.vocab_size != target.vocab_size:
            raise ValueError(f"the draft model {path} has a vocabulary of {loaded.config.vocab_size} tokens, the "
                             f"served model {target.vocab_size}: a draft model must share the tokenizer")
        return cls(in_passing_thread(lambda: ModelRunner(loaded.model, num_blocks, block_size, device=device,
                                                         dtype=kv_dtype)))

    @torch.inference_mode()
    def propose(self, views: list[DraftView]) -> None:
        """Set each viewed sequence's `draft_token_ids` to its k greedy draft tokens."""
        active = views
        while active:
            batch = _DraftBatch(active, [v.num_tokens - v.num_computed_tokens for v in active])
            logits, _ = self.runner.run(batch)
            for view, token in zip(active, argmax_rows(logits), strict=True):
                view.num_computed_tokens = view.num_tokens
                view.token_ids.append(token)
            active = [v for v in active if v.num_tokens - v.base < v.k]
        for view in views:
            view.seq.draft_token_ids = view.token_ids[view.base :]
            view.kv.num_computed_tokens = view.num_computed_tokens


def _draft_kv(seq: Sequence) -> DraftKV:
    """The sequence's draft KV record, reset when its block table is not the one the KV was written in
    (a preempted sequence gets new blocks), and cut to the target's computed tokens (a rejected draft's KV
    is the draft model's guess, not the sequence's token)."""
    state = seq.draft_state
    assert state is not None
    kv = state.draft_kv
    if kv.block_table is not seq.block_table:
        kv.block_table, kv.num_computed_tokens = seq.block_table, 0
    kv.num_computed_tokens = min(kv.num_computed_tokens, seq.num_computed_tokens)
    return kv
