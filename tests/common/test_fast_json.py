"""fast_json reads and writes what the standard library does: the same values, the same errors, the same JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from common import fast_json

TEXTS = [b'{"model":"m","messages":[{"role":"user","content":"h\\u00e9llo \\ud83d\\ude00"}],"max_tokens":20}',
         b'{"a":NaN,"b":-Infinity}', b'{"seed":123456789012345678901234567890}', b'[18446744073709551616]',
         b'[1e400, 1.5e-7, -0.0, 0.1]', b'"\\ud800"', '{"é":[true,false,null]}', b'{"a":1,"a":2}',
         '{"seed":"é","n":123456789012345678901234567890}', '["\ud800", 12345678901234567890123]']  # texts too


@pytest.mark.parametrize("text", TEXTS)
def test_reads_the_same_value_as_json(text: bytes | str) -> None:
    assert repr(fast_json.loads(text)) == repr(json.loads(text))


@pytest.mark.parametrize("text", [b'{"a":1', b"", b"[1,]", b"\xff", b'{"a":1}x'])
def test_refuses_what_json_refuses_with_its_message(text: bytes) -> None:
    with pytest.raises(ValueError) as expected:
        json.loads(text)
    with pytest.raises(ValueError) as refused:
        fast_json.loads(text)
    assert str(refused.value) == str(expected.value)


OBJECTS: list[Any] = [{"id": "x", "choices": [{"index": 0, "delta": {"content": "é ✓ \u2028"}}], "n": 2**70},
                      {"a": math.nan, "b": math.inf}, {1: "one"}, {"finish_reason": None}, ["\x00\x1f\"\\"]]


@pytest.mark.parametrize("obj", OBJECTS)
def test_writes_the_json_that_json_writes(obj: Any) -> None:
    assert fast_json.dumps(obj) == json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def test_small_floats_read_back_as_the_same_numbers() -> None:
    numbers = [1e-7, 2.5e-5, 7.336076906388567e-05, 5e-324]
    assert json.loads(fast_json.dumps(numbers)) == numbers


def test_a_response_refuses_nan_as_starlette_does() -> None:
    with pytest.raises(ValueError):
        fast_json.FastJSONResponse({"a": math.nan})
    assert fast_json.FastJSONResponse({"a": "é"}).body == '{"a":"é"}'.encode()


def test_reading_many_gives_each_ones_value_or_leaves_them_to_be_read_one_by_one() -> None:
    chunks = [b'{"id":"c","created":1733500000,"choices":[{"delta":{"content":"a"}}]}', b'{"usage":{"p":1}}']
    assert repr(fast_json.loads_all(chunks)) == repr([json.loads(c) for c in chunks])
    assert fast_json.loads_all([]) == []
    # whatever orjson would not read as json does (a long integer, NaN, a broken text) is read one by one
    for odd in (b'{"seed":123456789012345678901234567890}', b'{"a":NaN}', b'{"a":1'):
        assert fast_json.loads_all([chunks[0], odd]) is None
    # digits on both sides of the join make no long run of their own
    assert fast_json.loads_all([b"1234567890", b"1234567890"]) == [1234567890, 1234567890]


def test_eighteen_digits_are_read_by_orjson_and_nineteen_by_json_anywhere_in_the_text() -> None:
    eighteen, nineteen = b"9" * 18, b"9" * 19
    for text in (b"[" + eighteen + b"]", b'{"a":"x' + eighteen + b'"}', b"[1.5" + eighteen + b"]"):
        assert repr(fast_json.loads(text)) == repr(json.loads(text))
    assert fast_json.loads(b"[" + nineteen + b"]") == [int(nineteen)]  # an integer orjson would make a float
    assert fast_json.loads(b'["\xd9\xa3' + eighteen + b'"]') == json.loads(b'["\xd9\xa3' + eighteen + b'"]')
    assert fast_json.loads_all([b"[" + eighteen + b"]", b"[" + nineteen + b"]"]) is None
