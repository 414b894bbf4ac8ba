"""Sampling a step whose sequences may carry draft tokens (speculative decoding).

A sequence without drafts has one logits row and goes through the `Sampler` as always. A sequence with k
drafts has k + 1 rows, row j being the distribution after its j-th draft; it keeps the longest accepted
prefix of its drafts plus one token of the target's own, so each verification emits 1 to k + 1 tokens.
Greedy: a draft is accepted while it equals the argmax, and the argmax at the first mismatch is emitted.
Sampled: rejection sampling against a draft distribution q that is a point mass (prompt-lookup and greedy
draft-model drafts both are): draft d is accepted with probability min(1, p(d) / q(d)) = p(d); on rejection
the token is drawn from the normalised max(0, p - q), that is p without d; after k acceptances a bonus token
is drawn from the last row. The emitted tokens are then distributed exactly as plain sampling's.
Drafted sequences never use penalties, grammars or logprobs (the engine does not draft for them); min_tokens
and logit_bias apply per row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from backend.executor.sample.batch import SamplingOptions, StepSequence
from backend.executor.sample.sampler import Sampler, TokenLogprobs, argmax_rows


@dataclass(slots=True)
class StepTokens:
    """The tokens each sampling sequence gets from one step (one, or several after a verification)."""

    token_ids: list[list[int]]
    logprobs: list[list[TokenLogprobs | None]]


class DraftVerifier:
    """Splits a step's logits rows between plain sampling and the verification of drafted sequences."""

    def __init__(self, eos_token_ids: Iterable[int]) -> None:
        self.sampler = Sampler(eos_token_ids)

    def __call__(self, logits: torch.Tensor, seqs: Sequence[StepSequence]) -> StepTokens:
        """`logits` holds one row per sequence, or 1 + k for one with k drafts, in the order of `seqs`."""
        if not any(seq.draft_token_ids for seq in seqs):
            out = self.sampler(logits, seqs)
            return StepTokens([[t] for t in out.token_ids], [[lp] for lp in out.logprobs])
        firsts, row = [], 0
        for seq in seqs:
            firsts.append(row)
            row += 1 + len(seq.draft_token_ids)
        plain = [i for i, seq in enumerate(seqs) if not seq.draft_token_ids]
        tokens: list[list[int]] = [[] for _ in seqs]
        logprobs: list[list[TokenLogprobs | None]] = [[] for _ in seqs]
        if plain:
            rows = torch.tensor([firsts[i] for i in plain], device=logits.device)
            out = self.sampler(logits.index_select(0, rows), [seqs[i] for i in plain])
            for i, token, lp in zip(plain, out.token_ids, out.logprobs, strict=True):
                tokens[i], logprobs[i] = [token], [lp]
        for i, seq in enumerate(seqs):
            if seq.draft_token_ids:
                k = len(seq.draft_token_ids)
                tokens[i] = self._verify(logits[firsts[i] : firsts[i] + k + 1], seq)
                logprobs[i] = [None] * len(tokens[i])
        return StepTokens(tokens, logprobs)

    def _verify(self, rows: torch.Tensor, seq: StepSequence) -> list[int]:
        draft, params = seq.draft_token_ids, seq.params
        # row j chooses completion token number num_completion_tokens + j
        early = min(rows.shape[0], params.min_tokens - seq.num_completion_tokens)
        if early > 0:
            banned = [t for t in (*self.sampler.eos_token_ids, *params.stop_token_ids) if t < rows.shape[1]]
            rows[:early, banned] = float("-inf")
        if params.logit_bias:
            ids = torch.tensor(list(params.logit_bias), device=rows.device)
            rows[:, ids] += torch.tensor(list(params.logit_bias.values()), dtype=rows.dtype, device=rows.device)
        if params.greedy:
            best = argmax_rows(rows)
            accepted = 0
            while accepted < len(draft) and draft[accepted] == best[accepted]:
                accepted += 1
            return [*draft[:accepted], best[accepted]]
        probs = target_probs(rows, params)
        k = len(draft)
        chances = probs[torch.arange(k, device=probs.device), torch.tensor(draft, device=probs.device)].tolist()
        draws = torch.rand(k, generator=seq.generator, device=probs.device).tolist()
        for j in range(k):
            if draws[j] >= chances[j]:
                residual = probs[j].clone()
                residual[draft[j]] = 0.0
                return [*draft[:j], int(torch.multinomial(residual, 1, generator=seq.generator))]
        return [*draft, int(torch.multinomial(probs[k], 1, generator=seq.generator))]


def target_probs(logits: torch.Tensor, params: SamplingOptions) -> torch.Tensor:
    """The distribution plain sampling draws from for each row [R, vocab]: temperature, then top-k, then
    top-p over what is left, as a full-vocabulary probability table."""
    scaled = logits / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        # Keep the smallest head whose mass reaches top_p; the first token always survives.
        ordered, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(ordered, dim=-1) - ordered
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, mass_before > params.top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs
