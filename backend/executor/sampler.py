"""Choosing each request's next token from the step's logits."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from backend.executor.batch import SamplingOptions, StepSequence
from backend.executor.token_mask import apply_token_constraints


class Sampler:
    """Greedy rows in one argmax; random rows one by one, each with its own generator, so a seeded request
    draws the same numbers whatever else shares its batch."""

    def __init__(self, eos_token_ids: Iterable[int]) -> None:
        self.eos_token_ids = sorted(eos_token_ids)

    def __call__(self, logits: torch.Tensor, seqs: Sequence[StepSequence]) -> list[int]:
        """Sample one token per row of `logits` [R, vocab] (float32, on any device) for the R sequences."""
        if not seqs:
            return []
        self._mask_early_stops(logits, seqs)
        apply_token_constraints(logits, seqs, self.eos_token_ids)
        tokens = logits.argmax(dim=-1).tolist()
        for row, seq in enumerate(seqs):
            if not seq.params.greedy:
                tokens[row] = _sample_row(logits[row], seq.params, _generator(seq, logits.device))
        return tokens

    def _mask_early_stops(self, logits: torch.Tensor, seqs: Sequence[StepSequence]) -> None:
        """Forbid EOS and stop tokens until a request reaches its min_tokens."""
        for row, seq in enumerate(seqs):
            if seq.num_completion_tokens < seq.params.min_tokens:
                banned = [t for t in (*self.eos_token_ids, *seq.params.stop_token_ids) if t < logits.shape[1]]
                logits[row, banned] = float("-inf")


def _generator(seq: StepSequence, device: torch.device) -> torch.Generator | None:
    # On the logits' device, so that sampling on a GPU sends back only the chosen ids.
    if seq.params.seed is not None and seq.generator is None:
        seq.generator = torch.Generator(device=device).manual_seed(seq.params.seed)
    return seq.generator


def _sample_row(logits: torch.Tensor, params: SamplingOptions, generator: torch.Generator | None) -> int:
    scaled = logits / params.temperature
    order: torch.Tensor | None = None
    if 0 < params.top_k < scaled.numel():
        scaled, order = torch.topk(scaled, params.top_k)  # sorted, largest first
    elif params.top_p < 1.0:
        scaled, order = torch.sort(scaled, descending=True)
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        # Keep the smallest head whose mass reaches top_p; the first token always survives.
        mass_before = torch.cumsum(probs, dim=-1) - probs
        probs = probs.masked_fill(mass_before > params.top_p, 0.0)
    choice = int(torch.multinomial(probs, 1, generator=generator))
    return int(order[choice]) if order is not None else choice
