"""The engine's output processing: a request's text, cut at its stop strings, its finish reason, its deltas.

`finish_reason` runs under the engine lock (it needs only token ids); `step_text`, which detokenizes and
searches for stop strings, runs outside it on the sequence's own output state.
"""

from __future__ import annotations

from typing import Protocol

from backend.engine.records import Delta, TokenLogprobs
from backend.engine.sequence import FinishReason, Sequence


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


def step_text(seq: Sequence, token_id: int, ahead: int = 0) -> tuple[str, bool]:
    """The text made final by an appended token (followed by `ahead` more of the same step), and whether a
    stop string ended the output there."""
    output: TextOutput = seq.output
    reason = seq.finish_reason if ahead == 0 else None  # only the step's last token can have ended it
    if reason is FinishReason.STOP:  # a stop token: its text is not part of the output
        return output.flush(), False
    text, stopped = output.push(token_id, seq.num_completion_tokens - ahead >= seq.params.min_tokens)
    if not stopped and reason is FinishReason.LENGTH:
        text += output.flush()
    return text, stopped


def step_output(seq: Sequence, token_ids: list[int], logprobs: list[TokenLogprobs | None]
                ) -> tuple[str, int | None, list[TokenLogprobs]]:
    """The text of one step's tokens of a sequence, how many of them a stop string kept (None when no stop
    string matched), and the logprobs to show."""
    text = ""
    for count, token_id in enumerate(token_ids, 1):
        piece, stopped = step_text(seq, token_id, len(token_ids) - count)
        text += piece
        if stopped:
            return text, count, _shown(seq, logprobs[:count])
    return text, None, _shown(seq, logprobs)


def _shown(seq: Sequence, logprobs: list[TokenLogprobs | None]) -> list[TokenLogprobs]:
    shown = [lp for lp in logprobs if lp is not None]
    if seq.finish_reason is FinishReason.STOP and len(shown) == len(logprobs):
        shown = shown[:-1]  # a stop token is no part of the output, so it has no logprobs entry either
    return shown


def delta(seq: Sequence, text: str, token_ids: list[int], logprobs: list[TokenLogprobs]) -> Delta:
    """One step's news for a request; the final one carries the finish reason and the timings."""
    finished = seq.finish_reason.value if seq.finish_reason is not None else None
    return Delta(
        request_id=seq.request_id,
        text=text,
        token_ids=token_ids,
        logprobs=logprobs,
        index=seq.index,
        finish_reason=finished,
        prompt_tokens=seq.num_prompt_tokens,
        completion_tokens=seq.num_completion_tokens,
        cached_tokens=seq.num_cached_tokens,
        timings=seq.timings if finished else None,
    )
