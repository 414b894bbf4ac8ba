"""A request's sampling fields: read from the body as given, then merged over the model's generation defaults
into the engine's `SamplingParams` (the one definition of every field's meaning and range)."""

from __future__ import annotations

import json
from typing import Any

from backend.engine.sampling_params import MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, SamplingParams
from backend.server.api_errors import invalid
from backend.server.fields.body import bool_field, float_field, int_field, int_list, utf8


def read_sampling(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    """The `SamplingParams` fields the body sets (None and absent fields are left out, so defaults apply)."""
    fields: dict[str, Any] = {
        "temperature": float_field(body, "temperature", 0.0, 2.0),
        "top_p": float_field(body, "top_p", 0.0, 1.0),
        "seed": int_field(body, "seed", lo=0, hi=2**63 - 1),
        "min_tokens": int_field(body, "min_tokens", lo=0),
        "presence_penalty": float_field(body, "presence_penalty", -2.0, 2.0),
        "frequency_penalty": float_field(body, "frequency_penalty", -2.0, 2.0),
        "repetition_penalty": float_field(body, "repetition_penalty", 0.0, 10.0),
        "logit_bias": _logit_bias(body.get("logit_bias")),
        "logprobs": _chat_logprobs(body) if chat else int_field(body, "logprobs", lo=0, hi=MAX_TOP_LOGPROBS),
    }
    if fields["top_p"] == 0.0:
        raise invalid("`top_p` must be greater than 0", "top_p")
    if fields["repetition_penalty"] == 0.0:
        raise invalid("`repetition_penalty` must be greater than 0", "repetition_penalty")
    top_k = int_field(body, "top_k", lo=-1)
    if top_k is not None:
        fields["top_k"] = 0 if top_k == -1 else top_k  # vLLM spells "off" as -1
    if body.get("stop") is not None:
        fields["stop"] = _stop(body["stop"])
    if body.get("stop_token_ids") is not None:
        fields["stop_token_ids"] = int_list(body["stop_token_ids"], "stop_token_ids")
    if body.get("ignore_eos") is not None:
        fields["ignore_eos"] = bool_field(body, "ignore_eos")
    return {name: value for name, value in fields.items() if value is not None}


def sampling_params(fields: dict[str, Any], defaults: dict[str, Any], max_tokens: int) -> SamplingParams:
    """The request's fields over the model's defaults; a value out of range is a 400 naming its field."""
    try:
        return SamplingParams(**{**defaults, **fields, "max_tokens": max_tokens})
    except ValueError as exc:
        message = str(exc)
        raise invalid(message, next((name for name in _NAMED if name in message), None)) from None


# Longest first, so that a message about `top_logprobs` is not taken for one about `logprobs`.
_NAMED = ("presence_penalty", "frequency_penalty", "repetition_penalty", "stop_token_ids", "top_logprobs",
          "logit_bias", "max_tokens", "min_tokens", "temperature", "logprobs", "top_p", "top_k", "seed", "stop")


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    top = int_field(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    if not bool_field(body, "logprobs"):
        if top:
            raise invalid("`top_logprobs` needs `logprobs: true`", "top_logprobs")
        return None
    return top or 0


def _logit_bias(value: Any) -> dict[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("`logit_bias` must be an object mapping token ids to numbers", "logit_bias")
    if len(value) > MAX_LOGIT_BIAS:
        raise invalid(f"`logit_bias` may hold at most {MAX_LOGIT_BIAS} tokens, got {len(value)}", "logit_bias")
    bias: dict[int, float] = {}
    for key, number in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()) or isinstance(number, bool) \
                or not isinstance(number, int | float) or not -100 <= number <= 100:
            raise invalid(f"`logit_bias` maps token ids to numbers in [-100, 100]; got "
                          f"{json.dumps(key)[:40]}: {json.dumps(number)[:40]}", "logit_bias")
        bias[int(key)] = float(number)
    return bias


def _stop(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise invalid("`stop` must be a non-empty string or a list of non-empty strings", "stop")
    return [utf8(s, "stop") for s in value]
