"""What the engine refuses before it queues a request: the checks that no scheduling could ever satisfy."""

from __future__ import annotations

from backend.engine.choices import MAX_CHOICES
from backend.engine.errors import InvalidGenerateRequest
from backend.engine.records import GenerateRequest


def validate_request(request: GenerateRequest, vocab_size: int, max_model_len: int) -> None:
    """Raise InvalidGenerateRequest naming the first thing wrong with the request."""
    try:
        request.params.validate()
    except ValueError as exc:
        raise InvalidGenerateRequest(str(exc)) from None
    if not 1 <= request.n <= MAX_CHOICES:
        raise InvalidGenerateRequest(f"n must be between 1 and {MAX_CHOICES}, got {request.n}")
    prompt = request.prompt_token_ids
    if not prompt:
        raise InvalidGenerateRequest("the prompt is empty")
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        raise InvalidGenerateRequest(f"prompt token ids must be in [0, {vocab_size})")
    if any(t >= vocab_size for t in request.params.logit_bias):
        raise InvalidGenerateRequest(f"logit_bias token ids must be in [0, {vocab_size})")
    total = len(prompt) + request.params.max_tokens
    if total > max_model_len:
        raise InvalidGenerateRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{total} tokens ({len(prompt)} in the prompt, {request.params.max_tokens} in the completion)."
        )
