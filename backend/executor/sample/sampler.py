"""Choosing each request's next token from the step's logits, and reporting its log-probabilities.

One step runs, in order: early-stop masks (min_tokens) -> penalties -> logit_bias -> [token masks] ->
log-probabilities (of the logits as they stand here) -> temperature, top-k, top-p -> sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from backend.executor.sample.batch import SamplingOptions, StepSequence
from backend.executor.sample.penalties import apply_logit_bias, apply_penalties, record_sampled
from backend.executor.sample.token_mask import apply_token_constraints

# OpenAI's stand-in for a probability that rounds to zero; JSON has no -inf.
MIN_LOGPROB = -9999.0


@dataclass(slots=True)
class TokenLogprobs:
    """The chosen token, its log-probability and the `top` most likely tokens (best first) at that step."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(slots=True)
class SamplerOutput:
    """One token per row, and its log-probabilities for the rows whose requests asked for them."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


class Sampler:
    """Greedy rows in one argmax; random rows one by one, each with its own generator, so a seeded request
    draws the same numbers whatever else shares its batch."""

    def __init__(self, eos_token_ids: Iterable[int]) -> None:
        self.eos_token_ids = sorted(eos_token_ids)

    def __call__(self, logits: torch.Tensor, seqs: Sequence[StepSequence]) -> SamplerOutput:
        """Sample one token per row of `logits` [R, vocab] (float32, on any device) for the R sequences."""
        if not seqs:
            return SamplerOutput([], [])
        if all(_plain_greedy(seq) for seq in seqs):  # the usual step: nothing to mask, bias or report
            no_logprobs: list[TokenLogprobs | None] = [None] * len(seqs)
            return SamplerOutput(argmax_rows(logits), no_logprobs)
        self._mask_early_stops(logits, seqs)
        penalized = apply_penalties(logits, seqs)
        apply_logit_bias(logits, seqs)
        apply_token_constraints(logits, seqs, self.eos_token_ids)
        log_probs = _log_probs(logits, seqs)
        tokens = argmax_rows(logits)
        for row, seq in enumerate(seqs):
            if not seq.params.greedy:
                tokens[row] = _sample_row(logits[row], seq.params, _generator(seq, logits.device))
        record_sampled(seqs, penalized, tokens)
        return SamplerOutput(tokens, _chosen_logprobs(log_probs, seqs, tokens))

    def _mask_early_stops(self, logits: torch.Tensor, seqs: Sequence[StepSequence]) -> None:
        """Forbid EOS and stop tokens until a request reaches its min_tokens."""
        for row, seq in enumerate(seqs):
            if seq.num_completion_tokens < seq.params.min_tokens:
                banned = [t for t in (*self.eos_token_ids, *seq.params.stop_token_ids) if t < logits.shape[1]]
                logits[row, banned] = float("-inf")


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """The index of each row's largest logit (the first on ties, as torch's argmax). On the CPU through numpy,
    whose vectorized argmax over a 49k vocabulary takes some 8 us where torch's takes about 90 (torch 2.13)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def _plain_greedy(seq: StepSequence) -> bool:
    """Whether the row's token is the argmax of its logits as the model gave them."""
    params = seq.params
    return (params.greedy and params.logprobs is None and not params.penalized and not params.logit_bias
            and seq.constraint is None and seq.num_completion_tokens >= params.min_tokens)


def _log_probs(logits: torch.Tensor, seqs: Sequence[StepSequence]) -> tuple[list[int], torch.Tensor] | None:
    """log-softmax of the rows that report logprobs, before temperature (the model's own distribution after
    penalties, biases and masks)."""
    rows = [i for i, seq in enumerate(seqs) if seq.params.logprobs is not None]
    if not rows:
        return None
    return rows, torch.log_softmax(logits[torch.tensor(rows, device=logits.device)], dim=-1)


def _chosen_logprobs(log_probs: tuple[list[int], torch.Tensor] | None, seqs: Sequence[StepSequence],
                     tokens: list[int]) -> list[TokenLogprobs | None]:
    out: list[TokenLogprobs | None] = [None] * len(seqs)
    if log_probs is None:
        return out
    rows, table = log_probs
    chosen = table.gather(1, torch.tensor([[tokens[r]] for r in rows], device=table.device)).squeeze(1)
    widest = max(seqs[r].params.logprobs or 0 for r in rows)
    top_values, top_ids = table.topk(widest, dim=-1)  # one transfer for the whole step below
    chosen_list, values, ids = chosen.tolist(), top_values.tolist(), top_ids.tolist()
    for i, row in enumerate(rows):
        k = seqs[row].params.logprobs or 0
        top = [(t, max(v, MIN_LOGPROB)) for t, v in zip(ids[i][:k], values[i][:k], strict=True)]
        out[row] = TokenLogprobs(tokens[row], max(chosen_list[i], MIN_LOGPROB), top)
    return out


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
