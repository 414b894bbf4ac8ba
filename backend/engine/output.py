"""The engine's output processing: a request's text, cut at its stop strings, and its finish reason."""

from __future__ import annotations

from typing import Protocol

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
