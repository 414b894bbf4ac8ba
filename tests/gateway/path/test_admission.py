"""The gateway side of admission: the token estimate, and a refusal turned into the right HTTP answer."""

from __future__ import annotations

from typing import Any

from gateway.path.admission import (
    bound_output,
    estimate_completion_tokens,
    estimate_prompt_tokens,
    rate_headers,
    refusal,
)
from quota import Admission, Level, LimitName, RateInfo


def _estimate(body: dict[str, Any]) -> int:
    return estimate_prompt_tokens(body, image_tokens=765)


def test_the_estimate_counts_bytes_of_text_in_every_prompt_shape() -> None:
    assert _estimate({"prompt": "x" * 400}) == 100
    assert _estimate({"prompt": ["x" * 200, "y" * 200]}) == 100
    chat = {"messages": [{"role": "user", "content": "x" * 384},
                         {"role": "user", "content": [{"type": "text", "text": "y" * 384}]}]}
    assert _estimate(chat) == (384 * 2 + 32) // 4
    assert _estimate({"prompt": "é" * 100}) == 50  # UTF-8 bytes, not characters
    assert _estimate({"messages": [None, 5]}) >= 1  # junk the upstream will reject still counts


def test_the_estimate_counts_tools_response_formats_tool_calls_and_images() -> None:
    plain = {"messages": [{"role": "user", "content": "hi"}]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                          "description": "d" * 4000}}}]
    assert _estimate({**plain, "tools": tools}) >= _estimate(plain) + 1000
    schema = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"description": "x" * 4000}}}
    assert _estimate({**plain, "response_format": schema}) >= _estimate(plain) + 1000
    call = {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "a" * 4000}}]}
    assert _estimate({"messages": [*plain["messages"], call]}) >= _estimate(plain) + 1000
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}
    with_images = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, picture, picture]}]}
    assert _estimate(with_images) == _estimate(plain) + 2 * 765  # by the per-image cost, not the base64 size


def test_an_answer_without_usage_is_estimated_at_one_token_or_more() -> None:
    assert estimate_completion_tokens({"choices": [{"message": {"content": "x" * 400}}]}) >= 100
    assert estimate_completion_tokens({"choices": [{"text": ""}]}) == 1
    assert estimate_completion_tokens({}) == 1


def _bound(body: dict[str, Any], chat: bool = True) -> tuple[int, dict[str, Any]]:
    return bound_output(body, chat, 512), body


def test_chat_honours_max_completion_tokens_then_max_tokens_and_forwards_only_that_limit() -> None:
    assert _bound({"max_completion_tokens": 7, "max_tokens": 9}) == (7, {"max_completion_tokens": 7})
    assert _bound({"max_tokens": 9}) == (9, {"max_tokens": 9})
    assert _bound({"max_tokens": True}) == (512, {"max_tokens": 512})  # no limit: the default, sent too
    assert _bound({"max_tokens": 9, "n": 4})[0] == 36  # every choice may use its max_tokens
    assert _bound({"max_tokens": 9, "n": 2, "best_of": 3})[0] == 27
    assert _bound({"n": 3})[0] == 1536 and _bound({"n": True})[0] == 512


def test_completions_honour_max_tokens_for_every_prompt_and_choice() -> None:
    conflicting = {"max_completion_tokens": 1, "max_tokens": 300, "prompt": "hi"}
    assert _bound(conflicting, chat=False) == (300, {"max_tokens": 300, "prompt": "hi"})
    assert _bound({"max_tokens": 4, "prompt": ["a"] * 50}, chat=False)[0] == 200
    assert _bound({"max_tokens": 4, "prompt": [[1, 2], [3]], "n": 2}, chat=False)[0] == 16
    assert _bound({"max_tokens": 4, "prompt": [1, 2, 3]}, chat=False)[0] == 4  # one pre-tokenised prompt
    assert _bound({"prompt": "hi"}, chat=False) == (512, {"max_tokens": 512, "prompt": "hi"})


def test_a_refused_budget_is_insufficient_quota_and_a_rate_is_rate_limit_exceeded() -> None:
    rate = RateInfo(limit_requests=60, remaining_requests=0, reset_requests=0.25, limit_tokens=1000,
                    remaining_tokens=10, reset_tokens=75.0)
    budget = refusal(Admission(False, refused_level=Level.account, refused_limit=LimitName.tokens_per_day,
                               retry_after=3600.0, rate=rate))
    assert (budget.status, budget.code, budget.headers["retry-after"]) == (429, "insufficient_quota", "3600")
    limited = refusal(Admission(False, refused_level=Level.key, refused_limit=LimitName.rpm, retry_after=0.25,
                                rate=rate))
    assert (limited.code, limited.headers["retry-after"], limited.headers["retry-after-ms"]) == (
        "rate_limit_exceeded", "1", "250")
    assert limited.headers["x-ratelimit-reset-requests"] == "250ms"
    assert limited.headers["x-ratelimit-reset-tokens"] == "1m15s"
    assert refusal(Admission(False, unavailable=True)).status == 503


def test_unlimited_levels_send_no_rate_headers() -> None:
    assert rate_headers(RateInfo()) == {}
    assert set(rate_headers(RateInfo(limit_tokens=5, remaining_tokens=9, reset_tokens=2.5))) == {
        "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"}
