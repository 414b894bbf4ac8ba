"""Admission at the gateway: the token estimate, the quota call's refusal as an HTTP answer, rate headers."""

from __future__ import annotations

from typing import Any

from gateway.errors import ApiError, retry_after_headers, unavailable
from quota import Admission, LimitName, RateInfo

BUDGET_LIMITS = (LimitName.tokens_per_day, LimitName.tokens_per_month)


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """A cheap prompt-size estimate (UTF-8 bytes / 4, plus a few per chat message) used for admission."""
    size = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            size += 16  # role and framing tokens
            if isinstance(message, dict):
                size += _text_bytes(message.get("content"))
    else:
        size += _text_bytes(body.get("prompt"))
    return max(1, size // 4)


def _text_bytes(content: Any) -> int:
    if isinstance(content, str):
        return len(content.encode())
    if isinstance(content, list):
        return sum(_text_bytes(part.get("text") if isinstance(part, dict) else part) for part in content)
    if isinstance(content, int):
        return 4  # a token id in a pre-tokenised prompt
    return 0


def max_output_tokens(body: dict[str, Any], default: int) -> int:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


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


def refusal(admission: Admission) -> ApiError:
    """The answer to a refused admission: 503 when the store failed closed, else 429 naming the limit."""
    if admission.unavailable:
        return unavailable("the quota store is unavailable; retry shortly", retry_after=1.0,
                           code="store_unavailable")
    limit = admission.refused_limit.value if admission.refused_limit else "limit"
    level = admission.refused_level.value if admission.refused_level else "key"
    retry_after = admission.retry_after if admission.retry_after is not None else 1.0
    headers = {**rate_headers(admission.rate), **retry_after_headers(retry_after)}
    if admission.refused_limit in BUDGET_LIMITS:
        message = f"the {level}'s {limit} budget is used up"
        return ApiError(429, message, "insufficient_quota", "insufficient_quota", None, headers)
    message = f"rate limit reached: the {level}'s {limit} limit; retry after {retry_after:.2f}s"
    return ApiError(429, message, "rate_limit_exceeded", "rate_limit_exceeded", None, headers)
