"""Admission at the gateway: the token estimate, the quota call's refusal as an HTTP answer, rate headers."""

from __future__ import annotations

import json
from typing import Any

from gateway.errors import ApiError, forbidden, retry_after_headers, unavailable
from quota import Admission, LimitName, RateInfo

BUDGET_LIMITS = (LimitName.tokens_per_day, LimitName.tokens_per_month, LimitName.budget, LimitName.balance)


# request fields that the upstream's chat template or guided decoding turns into prompt tokens
PROMPT_FIELDS = ("tools", "functions", "tool_choice", "response_format", "structured_outputs", "guided_json",
                 "guided_regex", "guided_choice", "guided_grammar")
IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})


def estimate_prompt_tokens(body: dict[str, Any], *, image_tokens: int) -> int:
    """A cheap estimate of everything that becomes prompt tokens, used for admission and for charging an answer
    without usage: UTF-8 bytes / 4 of the text, tool calls, tools and response formats, a few tokens of framing
    per chat message, and `image_tokens` per input image."""
    size, images = 0, 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            size += 16  # role and framing tokens
            if isinstance(message, dict):
                text, pictures = _content_size(message.get("content"))
                size += text + _json_bytes(message.get("tool_calls")) + _json_bytes(message.get("function_call"))
                images += pictures
    else:  # a completion's prompt, or an embedding's input
        size, images = _content_size(body["prompt"] if "prompt" in body else body.get("input"))
    size += sum(_json_bytes(body.get(name)) for name in PROMPT_FIELDS)
    return max(1, size // 4) + images * image_tokens


def estimate_completion_tokens(answer: dict[str, Any]) -> int:
    """The completion tokens of a whole answer that came without usage: at least 1, it was served."""
    choices = answer.get("choices")
    size = 0
    if isinstance(choices, list):
        size = sum(_json_bytes(c.get("message") or c.get("text")) for c in choices if isinstance(c, dict))
    return max(1, size // 4)


def _content_size(content: Any) -> tuple[int, int]:
    """(text bytes, images) of a message's content or a prompt; one level of parts, never deeper, so that a
    hostile nesting costs nothing here (the upstream rejects it)."""
    if isinstance(content, str):
        return len(content.encode()), 0
    if not isinstance(content, list):
        return 0, 0
    size, images = 0, 0
    for part in content:
        if isinstance(part, dict):
            if part.get("type") in IMAGE_PARTS:
                images += 1
            elif isinstance(part.get("text"), str):
                size += len(part["text"].encode())
        elif isinstance(part, str):
            size += len(part.encode())
        elif isinstance(part, int):
            size += 4  # a token id in a pre-tokenised prompt
        elif isinstance(part, list):
            size += 4 * len(part)  # one pre-tokenised prompt of a batch
    return size, images


def _json_bytes(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode())
    try:
        return len(json.dumps(value, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        return 0


def bound_output(body: dict[str, Any], chat: bool, default: int) -> int:
    """Decides a generating request's output limit, writes it into `body` as the one limit field the upstream
    honours, and answers the most completion tokens the request may cost: that limit for each prompt and choice.

    Chat honours `max_completion_tokens` before `max_tokens` (as OpenAI does), completions `max_tokens`; the other
    field is dropped so no upstream can read a larger one, and a request without a limit gets `default`, sent too.
    Inbound Messages and Responses bodies arrive here already as chat, their limit in `max_tokens`.
    """
    completion_limit = _positive(body.pop("max_completion_tokens", None))
    chosen = completion_limit if chat else None  # completions have max_tokens only
    asked = _positive(body.pop("max_tokens", None))
    per_choice = chosen or asked or default
    body["max_completion_tokens" if chosen else "max_tokens"] = per_choice
    choices = max(1, _positive(body.get("n")) or 1, _positive(body.get("best_of")) or 1)
    prompts = 1 if chat else _prompt_count(body.get("prompt"))
    return per_choice * choices * prompts


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _prompt_count(prompt: Any) -> int:
    """How many prompts a completions request holds: each is answered `n` times (a list of token ids is one)."""
    if not isinstance(prompt, list) or not prompt or all(isinstance(p, int) for p in prompt):
        return 1
    return len(prompt)


def rate_headers(rate: RateInfo) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers for the tightest level; absent where that level is unlimited."""
    headers: dict[str, str] = {}
    for kind in ("requests", "tokens"):
        limit = getattr(rate, f"limit_{kind}")
        if limit is None:
            continue
        headers[f"x-ratelimit-limit-{kind}"] = str(limit)
        headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, getattr(rate, f"remaining_{kind}") or 0))
        headers[f"x-ratelimit-reset-{kind}"] = _duration(getattr(rate, f"reset_{kind}") or 0.0)
    return headers


def _duration(seconds: float) -> str:
    """OpenAI's reset format: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s" if minutes else f"{rest:.3g}s"


def refusal(admission: Admission, model: str = "") -> ApiError:
    """The answer to a refused admission: 503 when the store failed closed, 403 for a model without a price, else
    429 naming the limit."""
    if admission.refused_limit is LimitName.unpriced:
        return forbidden(f"the model {model!r} has no price; an account that pays with a prepaid balance or a "
                         "budget cannot use it until an admin sets one", "model_not_priced")
    if admission.unavailable:
        return unavailable("the quota store is unavailable; retry shortly", retry_after=1.0,
                           code="store_unavailable")
    limit = admission.refused_limit.value if admission.refused_limit else "limit"
    level = admission.refused_level.value if admission.refused_level else "key"
    retry_after = admission.retry_after if admission.retry_after is not None else 1.0
    headers = {**rate_headers(admission.rate), **retry_after_headers(retry_after)}
    if admission.refused_limit is LimitName.balance:
        message = f"the {level}'s prepaid balance cannot cover this request's maximum cost; top it up"
        return ApiError(429, message, "insufficient_quota", "insufficient_quota", None, headers)
    if admission.refused_limit is LimitName.budget:
        message = f"the {level}'s spend budget for this window is used up"
        return ApiError(429, message, "insufficient_quota", "insufficient_quota", None, headers)
    if admission.refused_limit in BUDGET_LIMITS:
        message = f"the {level}'s {limit} budget is used up"
        return ApiError(429, message, "insufficient_quota", "insufficient_quota", None, headers)
    message = f"rate limit reached: the {level}'s {limit} limit; retry after {retry_after:.2f}s"
    return ApiError(429, message, "rate_limit_exceeded", "rate_limit_exceeded", None, headers)
