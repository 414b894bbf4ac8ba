"""OpenAI response bodies: whole responses, stream chunks and usage, in exactly OpenAI's shapes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from backend.engine.records import TokenLogprobs
from backend.server.logprobs import LogprobsFormatter
from backend.server.protocol import Endpoint


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


@dataclass(slots=True)
class ResponseBuilder:
    """Builds every body of one request, so its id, `created` and model agree across all chunks."""

    endpoint: Endpoint
    request_hex: str
    model: str
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    logprobs: LogprobsFormatter | None = None  # set when the request asked for logprobs

    @property
    def id(self) -> str:
        prefix = "chatcmpl-" if self.endpoint is Endpoint.CHAT else "cmpl-"
        return prefix + self.request_hex

    def response(self, text: str | None, finish_reason: str, usage_body: dict[str, Any],
                 logprobs: list[TokenLogprobs] | None = None, index: int = 0,
                 tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The non-streaming body, with choice `index` (an n > 1 response joins several bodies' choices);
        a chat answer with `tool_calls` ends with finish_reason "tool_calls"."""
        if self.endpoint is Endpoint.CHAT:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message["tool_calls"] = tool_calls
                finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
            choice: dict[str, Any] = {"index": index, "message": message,
                                      "logprobs": self._logprobs(logprobs, index), "finish_reason": finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": index, "text": text, "logprobs": self._logprobs(logprobs, index),
                      "finish_reason": finish_reason}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": usage_body}

    def role_chunk(self, index: int = 0) -> dict[str, Any] | None:
        """Chat streams open with the assistant role and empty content, as OpenAI's do."""
        if self.endpoint is not Endpoint.CHAT:
            return None
        return self._chunk({"role": "assistant", "content": ""}, None, index)

    def text_chunk(self, text: str, finish_reason: str | None = None,
                   logprobs: list[TokenLogprobs] | None = None, index: int = 0) -> dict[str, Any]:
        if self.endpoint is Endpoint.CHAT:
            body = self._chunk({"content": text} if text or logprobs else {}, finish_reason, index)
        else:
            body = self._chunk(text, finish_reason, index)
        body["choices"][0]["logprobs"] = self._logprobs(logprobs, index)
        return body

    def tool_call_chunk(self, call_delta: dict[str, Any], index: int = 0) -> dict[str, Any]:
        """One tool-call delta, as OpenAI streams them: the call's index with its id, type and name first, then
        argument fragments."""
        return self._chunk({"tool_calls": [call_delta]}, None, index)

    def usage_chunk(self, usage_body: dict[str, Any]) -> dict[str, Any]:
        """The `include_usage` chunk: empty choices, the usage of the whole request."""
        body = self._envelope()
        body["choices"] = []
        body["usage"] = usage_body
        return body

    def _chunk(self, delta: dict[str, Any] | str, finish_reason: str | None, index: int) -> dict[str, Any]:
        if isinstance(delta, dict):
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None,
                                      "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": delta, "logprobs": None, "finish_reason": finish_reason}
        body = self._envelope()
        body["choices"] = [choice]
        if self.include_usage:
            body["usage"] = None  # OpenAI marks every chunk but the last as carrying no usage
        return body

    def _logprobs(self, entries: list[TokenLogprobs] | None, index: int) -> dict[str, Any] | None:
        return self.logprobs.body(entries, index) if self.logprobs is not None and entries else None

    def _envelope(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.endpoint is Endpoint.CHAT else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}
