"""Penalties and logit biases, applied to a whole step's logits in a few tensor ops with per-row parameters.

Each penalized sequence keeps its token counts on the logits' device (`PenaltyState`), built once from its
tokens and then updated with one increment per sampled token, so a step never rescans a sequence.
Formulas: repetition as transformers' RepetitionPenaltyLogitsProcessor (over prompt and output: a positive
logit divided by the penalty, a negative one multiplied); presence and frequency as OpenAI documents them
(over the output only: minus presence if the token occurred, minus frequency times its count); logit_bias
added as given.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.executor.sample.batch import PenaltyState, StepSequence


def apply_penalties(logits: torch.Tensor, seqs: Sequence[StepSequence]) -> list[int]:
    """Penalize the rows whose requests ask for it, in place; return those rows (their states need `record`)."""
    rows = [i for i, seq in enumerate(seqs) if seq.params.penalized]
    if not rows:
        return rows
    vocab, device = logits.shape[1], logits.device
    states = [_state(seqs[i], vocab, device) for i in rows]
    counts = torch.stack([s.counts for s in states])
    occurred = counts > 0
    seen = occurred | torch.stack([s.in_prompt for s in states])

    def column(name: str) -> torch.Tensor:
        return torch.tensor([getattr(seqs[i].params, name) for i in rows], device=device).unsqueeze(1)

    index = torch.tensor(rows, device=device)
    picked = logits[index]
    repetition = column("repetition_penalty")
    picked = torch.where(seen, torch.where(picked > 0, picked / repetition, picked * repetition), picked)
    picked -= column("frequency_penalty") * counts + column("presence_penalty") * occurred
    logits[index] = picked
    return rows


def apply_logit_bias(logits: torch.Tensor, seqs: Sequence[StepSequence]) -> None:
    """Add every row's logit_bias in one scatter."""
    rows: list[int] = []
    tokens: list[int] = []
    biases: list[float] = []
    for row, seq in enumerate(seqs):
        for token, bias in seq.params.logit_bias.items():
            rows.append(row)
            tokens.append(token)
            biases.append(bias)
    if rows:
        device = logits.device
        index = (torch.tensor(rows, device=device), torch.tensor(tokens, device=device))
        logits.index_put_(index, torch.tensor(biases, dtype=logits.dtype, device=device), accumulate=True)


def record_sampled(seqs: Sequence[StepSequence], rows: list[int], tokens: list[int]) -> None:
    """Count each penalized row's new token, so the next step sees it without rescanning the sequence."""
    for row in rows:
        state = seqs[row].penalty_state
        assert state is not None
        state.record(tokens[row])


def _state(seq: StepSequence, vocab: int, device: torch.device) -> PenaltyState:
    if seq.penalty_state is None:
        seq.penalty_state = PenaltyState(seq.token_ids, seq.num_tokens - seq.num_completion_tokens, vocab, device)
    return seq.penalty_state
