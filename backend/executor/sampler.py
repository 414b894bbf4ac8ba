"""Choosing each request's next token, and deciding when its output stops."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import FinishReason, Sequence


class Sampler:
    """Greedy rows in one argmax; random rows one by one, each with its own generator, so a seeded request
    draws the same numbers whatever else shares its batch."""

    def __init__(self, eos_token_ids: Iterable[int]) -> None:
        self.eos_token_ids = sorted(eos_token_ids)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """Sample one token per row of `logits` [R, vocab] (float32, on any device) for the R sequences."""
        if not seqs:
            return []
        self._mask_early_stops(logits, seqs)
        tokens = logits.argmax(dim=-1).tolist()
        for row, seq in enumerate(seqs):
            if not seq.params.greedy:
                tokens[row] = _sample_row(logits[row], seq.params, _generator(seq, logits.device))
        return tokens

    def _mask_early_stops(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Forbid EOS and stop tokens until a request reaches its min_tokens."""
        for row, seq in enumerate(seqs):
            if seq.num_completion_tokens < seq.params.min_tokens:
                banned = [t for t in (*self.eos_token_ids, *seq.params.stop_token_ids) if t < logits.shape[1]]
                logits[row, banned] = float("-inf")


def _generator(seq: Sequence, device: torch.device) -> torch.Generator | None:
    # On the logits' device, so that sampling on a GPU sends back only the chosen ids.
    if seq.params.seed is not None and seq.generator is None:
        seq.generator = torch.Generator(device=device).manual_seed(seq.params.seed)
    return seq.generator


def _sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
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


class Detokenizer(Protocol):
    def push(self, token_id: int) -> str: ...
    def flush(self) -> str: ...


class TextOutput:
    """A request's output text: holds back any tail that could begin a stop string, and trims a match."""

    __slots__ = ("_detok", "_hold", "_pending", "_stop")

    def __init__(self, detok: Detokenizer, stop: list[str]) -> None:
        self._detok = detok
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._pending = ""

    def push(self, token_id: int, check_stop: bool) -> tuple[str, bool]:
        """Text made final by this token, and whether a stop string ended the output."""
        text = self._pending + self._detok.push(token_id)
        if check_stop and (cut := self._find_stop(text)) is not None:
            self._pending = ""
            return text[:cut], True
        keep = min(self._hold, len(text))
        self._pending = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def flush(self) -> str:
        text = self._pending + self._detok.flush()
        self._pending = ""
        cut = self._find_stop(text)
        return text if cut is None else text[:cut]

    def _find_stop(self, text: str) -> int | None:
        found = [i for s in self._stop if (i := text.find(s)) >= 0]
        return min(found) if found else None


def finish_reason(seq: Sequence, token_id: int, eos_token_ids: frozenset[int]) -> FinishReason | None:
    """Whether the token just appended ends the sequence by a stop token or its length limit."""
    params = seq.params
    is_stop = token_id in params.stop_token_ids or (not params.ignore_eos and token_id in eos_token_ids)
    if is_stop and seq.num_completion_tokens >= params.min_tokens:
        return FinishReason.STOP
    if seq.num_completion_tokens >= params.max_tokens:
        return FinishReason.LENGTH
    return None
