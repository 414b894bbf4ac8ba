"""JSON bodies of bounded depth: the limit is exact, and wide but shallow bodies pass."""

from __future__ import annotations

import json
import math

import pytest

from common.openai_errors import ApiError
from common.request_body import decode_json


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_nesting_up_to_the_limit_passes_and_one_more_level_is_a_400() -> None:
    assert decode_json(_nested(64), max_depth=64) is not None
    with pytest.raises(ApiError) as refused:
        decode_json(_nested(65), max_depth=64)
    assert refused.value.status == 400 and refused.value.code == "json_too_deep"


def test_objects_count_as_levels_and_strings_do_not() -> None:
    assert decode_json(json.dumps({"a": [{"b": "[[[[[[[[[["}]}).encode(), max_depth=3) == {"a": [{"b": "[[[[[[[[[["}]}
    with pytest.raises(ApiError):
        decode_json(json.dumps({"a": [{"b": [1]}]}).encode(), max_depth=3)


def test_a_wide_token_id_prompt_is_not_too_deep() -> None:
    body = json.dumps({"prompt": [[i, i + 1] for i in range(100_000)]}).encode()
    assert len(decode_json(body, max_depth=3)["prompt"]) == 100_000


def test_deeper_than_the_parser_can_go_is_a_400_too() -> None:
    with pytest.raises(ApiError) as refused:
        decode_json(_nested(200_000), max_depth=64)
    assert refused.value.code == "json_too_deep"


def test_broken_json_is_a_400() -> None:
    with pytest.raises(ApiError) as refused:
        decode_json(b'{"model": ', max_depth=64)
    assert refused.value.status == 400 and "not valid JSON" in refused.value.message


def test_nan_passes_unless_refused_and_a_tier_names_its_own_code() -> None:
    assert math.isnan(decode_json(b'{"t": NaN}', max_depth=64)["t"])  # the gateway forwards what the upstream judges
    with pytest.raises(ApiError) as refused:
        decode_json(b'{"t": NaN}', max_depth=64, allow_nan=False, invalid_code="invalid_json")
    assert refused.value.status == 400 and refused.value.code == "invalid_json" and "NaN" in refused.value.message
