"""Log-probabilities in OpenAI's two shapes: chat's `content` list and the legacy completions' parallel lists."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backend.engine.records import TokenLogprobs


class LogprobsFormatter:
    """Formats one request's logprobs, chunk by chunk; it keeps each choice's text offset, which completions
    report."""

    def __init__(self, chat: bool, token_text: Callable[[int], str]) -> None:
        self.chat = chat
        self.token_text = token_text
        self.offsets: dict[int, int] = {}  # per choice: characters of its text before its next token

    def body(self, entries: list[TokenLogprobs], index: int = 0) -> dict[str, Any]:
        """The `logprobs` object of choice `index`, or of one stream chunk's choice, for these tokens."""
        return self._chat(entries) if self.chat else self._completion(entries, index)

    def _chat(self, entries: list[TokenLogprobs]) -> dict[str, Any]:
        content = [{**self._token(e.token_id, e.logprob),
                    "top_logprobs": [self._token(t, lp) for t, lp in e.top]} for e in entries]
        return {"content": content, "refusal": None}

    def _completion(self, entries: list[TokenLogprobs], index: int) -> dict[str, Any]:
        tokens, offsets = [], []
        for e in entries:
            text = self.token_text(e.token_id)
            tokens.append(text)
            offsets.append(self.offsets.get(index, 0))
            self.offsets[index] = offsets[-1] + len(text)
        # as vLLM does, each position's alternatives include the chosen token
        top = [{**{self.token_text(t): lp for t, lp in e.top}, text: e.logprob}
               for e, text in zip(entries, tokens, strict=True)]
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": top,
                "text_offset": offsets}

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
