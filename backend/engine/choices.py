"""A request's choices: one sequence per choice of an n > 1 request, each sampling with its own seed.

The first choice is scheduled as any request; the others wait (PENDING) until its prompt's KV is computed,
then fork from it (`Scheduler.fork`), so the prompt is computed once for all of them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from backend.engine.output import TextOutput
from backend.engine.records import GenerateRequest
from backend.engine.sequence import Sequence, SequenceStatus
from backend.loading.tokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    from backend.loading.tokenizer import Tokenizer

MAX_CHOICES = 16
_SEED_STRIDE = 0x9E3779B97F4A7C15  # an odd constant: choice i's seed never equals another choice's


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice `index`'s seed, derived from the request's: choice 0 keeps it, so n = 1 is unchanged."""
    return None if seed is None else (seed + index * _SEED_STRIDE) % 2**63


def request_sequences(request: GenerateRequest, tokenizer: Tokenizer) -> list[Sequence]:
    """The request's sequences, first choice first; the others are the first's pending forks."""
    seqs = []
    for index in range(request.n):
        params = request.params
        if index > 0:
            params = dataclasses.replace(params, seed=choice_seed(params.seed, index))
        seq = Sequence(request.request_id, request.prompt_token_ids, params, priority=request.priority,
                       cache_salt=request.cache_salt, index=index)
        seq.output = TextOutput(IncrementalDetokenizer(tokenizer, request.prompt_token_ids), params.stop)
        # each choice walks its own grammar: a shared matcher would accept every choice's tokens
        constraint = request.constraint
        seq.constraint = constraint.fork() if constraint is not None and index > 0 else constraint
        if index > 0:
            seq.status = SequenceStatus.PENDING
        seqs.append(seq)
    seqs[0].forks = seqs[1:]
    return seqs
