"""Why the engine refuses or ends a request; the server maps each to an HTTP status."""

from __future__ import annotations


class InvalidGenerateRequest(ValueError):
    """The request can never run as given (empty prompt, too long, bad parameters): a 400."""


class EngineOverloaded(Exception):
    """The waiting queue is full (by count or by tokens): a 503 with Retry-After."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueTimeout(Exception):
    """The request could not start within the queue timeout: a 503 with Retry-After."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after
