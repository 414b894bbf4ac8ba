"""Records the request path, the inbound APIs and the metrics all read: what a client asked for (`OpenAIRequest`),
what it used (`Usage`) and how its answer ended (`Outcome`). A leaf, so that imports run one way."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Endpoint(StrEnum):
    """The upstream path a request goes to."""

    chat = "/chat/completions"
    completions = "/completions"
    embeddings = "/embeddings"

    @property
    def generates(self) -> bool:
        """Whether it produces tokens (and may stream them); an embedding costs its input tokens alone."""
        return self is not Endpoint.embeddings


@dataclass(slots=True)
class OpenAIRequest:
    """The fields the gateway routes and admits by; `body` is forwarded as it came, apart from `model`."""

    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool  # the client asked for the usage chunk at the end of a stream
    priority_class: str | None
    endpoint: Endpoint = Endpoint.chat


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of the prompt tokens, those the upstream served from its prompt cache


class Outcome(StrEnum):
    """How a relayed answer ended, as the log line and the breaker see it."""

    ok = "ok"
    upstream_error = "upstream_error"  # a non-2xx answer passed through
    cut = "cut"  # the upstream broke off after the first byte
    timeout = "timeout"  # idle or total deadline passed after the first byte
    disconnected = "disconnected"  # the client went away
    client_stalled = "client_stalled"  # the client stopped reading until the total deadline passed
