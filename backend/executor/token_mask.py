"""The step's grammar mask: constrained rows fill one packed bitmask, applied to the logits in one tensor op.

The bitmask is xgrammar's (and llguidance's) layout: int32 words, bit j of word w allows token 32*w + j.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.executor.batch import StepSequence

_BITS = torch.arange(32, dtype=torch.int32)


def apply_token_constraints(logits: torch.Tensor, seqs: Sequence[StepSequence]) -> None:
    """Set to -inf, in place, every logit a constrained row's grammar forbids; unconstrained rows are untouched."""
    rows = [row for row, seq in enumerate(seqs) if seq.constraint is not None]
    if not rows:
        return
    vocab = logits.shape[1]
    bitmask = torch.full((len(rows), (vocab + 31) // 32), -1, dtype=torch.int32)
    for i, row in enumerate(rows):
        constraint = seqs[row].constraint
        assert constraint is not None
        constraint.fill_next_token_bitmask(bitmask, i)
    allowed = ((bitmask.unsqueeze(-1) >> _BITS) & 1).view(len(rows), -1)[:, :vocab].bool()
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(~allowed.to(logits.device), float("-inf"))
