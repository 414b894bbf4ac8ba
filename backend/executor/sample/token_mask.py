"""The step's grammar mask: constrained rows fill one packed bitmask, applied to the logits in one op.

The bitmask is xgrammar's (and llguidance's) layout: int32 words, bit j of word w allows token 32*w + j. The
apply is xgrammar's kernel (C++ on CPU, CUDA/Triton on GPU): on a 49k vocabulary at batch 32 it took a third
of the time of unpacking the bits with torch ops (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.executor.sample.batch import StepSequence


def apply_token_constraints(logits: torch.Tensor, seqs: Sequence[StepSequence], eos_token_ids: Sequence[int]) -> None:
    """Set to -inf, in place, every logit a constrained row's grammar forbids; unconstrained rows are untouched.

    A grammar that allows no token at all (`root ::= root` never completes) gets its row's EOS instead: an
    all -inf row would make sampling fail for the whole batch."""
    rows = [row for row, seq in enumerate(seqs) if seq.constraint is not None]
    if not rows:
        return
    import xgrammar  # here, not at the top: a server that constrains nothing never loads it (~50 MiB)
    vocab = logits.shape[1]
    bitmask = torch.full((len(seqs), (vocab + 31) // 32), -1, dtype=torch.int32)
    for row in rows:
        constraint = seqs[row].constraint
        assert constraint is not None
        constraint.fill_next_token_bitmask(bitmask, row)
        if not bitmask[row].any():
            for token in eos_token_ids:
                bitmask[row, token // 32] |= _bit(token % 32)
    xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), indices=rows)


def _bit(j: int) -> int:
    """Bit j of an int32 word as a signed value (bit 31 is the sign bit)."""
    return -(2**31) if j == 31 else 1 << j
