"""Request validation: every malformed or unsupported request becomes a 400 naming the parameter."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.server.api_errors import ApiError
from backend.server.protocol import (
    Endpoint,
    check_token_ids,
    decode_body,
    parse_request,
    resolve_max_tokens,
)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "smollm2", "prompt": "hi", **fields}


def refused(body: dict[str, Any], endpoint: Endpoint = Endpoint.CHAT) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_request(body, endpoint)
    assert caught.value.status == 400
    assert caught.value.type == "invalid_request_error"
    return caught.value


def test_chat_request_maps_openai_fields_to_sampling_params() -> None:
    req = parse_request(chat(max_completion_tokens=7, max_tokens=99, temperature=0, top_p=0.5, top_k=-1,
                             seed=3, stop="END", ignore_eos=True, min_tokens=2, priority=-4, stream=True,
                             stream_options={"include_usage": True}, user="u1"), Endpoint.CHAT)
    params = req.sampling_params(req.max_tokens or 0)
    assert req.max_tokens == 7  # max_completion_tokens wins over the deprecated max_tokens
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.0, 0.5, 0, 3)
    assert params.stop == ["END"] and params.ignore_eos and params.min_tokens == 2
    assert req.priority == -4 and req.stream and req.include_usage


def test_developer_role_and_text_parts_become_plain_messages() -> None:
    req = parse_request(chat(messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
    ]), Endpoint.CHAT)
    assert req.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"},
                            {"role": "assistant", "content": ""}]


@pytest.mark.parametrize("prompt, expected", [("hello", "hello"), (["hello"], "hello"), ([1, 2, 3], [1, 2, 3]),
                                              ([[4, 5]], [4, 5])])
def test_completion_prompt_forms(prompt: Any, expected: Any) -> None:
    assert parse_request(completion(prompt=prompt), Endpoint.COMPLETION).prompt == expected


@pytest.mark.parametrize("body, param", [
    (chat(messages=[]), "messages"),
    (chat(messages="hi"), "messages"),
    ({"model": "smollm2"}, "messages"),
    (chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
    (chat(messages=[{"role": "tool", "content": 5}]), "messages[0].content"),
    (chat(messages=[{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]), "messages[0].tool_calls"),
    (chat(tools=[{"type": "function"}]), "tools[0]"),
    (chat(tool_choice="required"), "tool_choice"),
    (chat(response_format={"type": "xml"}), "response_format.type"),
    (chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}), "response_format.json_schema.name"),
    (chat(structured_outputs={"regex": "a", "choice": ["b"]}), "structured_outputs"),
    (chat(guided_choice=[]), "guided_choice"),
    (chat(guided_regex="a", response_format={"type": "json_object"}), "guided_regex"),
    (chat(messages=[{"content": "x"}]), "messages[0].role"),
    (chat(messages=["hi"]), "messages[0]"),
    (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": None}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages[0].content"),
    (chat(messages=[{"role": "user", "content": "\ud800"}]), "messages[0].content"),
    (chat(model=""), "model"),
    (chat(model=3), "model"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
    (chat(max_tokens="ten"), "max_tokens"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens=1.5), "max_tokens"),
    (chat(max_tokens=True), "max_tokens"),
    (chat(max_completion_tokens=-1), "max_completion_tokens"),
    (chat(temperature=2.5), "temperature"),
    (chat(temperature=-0.1), "temperature"),
    (chat(temperature="hot"), "temperature"),
    (chat(top_p=0), "top_p"),
    (chat(top_p=1.1), "top_p"),
    (chat(top_k=-2), "top_k"),
    (chat(seed=-1), "seed"),
    (chat(seed="x"), "seed"),
    (chat(stop=5), "stop"),
    (chat(stop=[""]), "stop"),
    (chat(stop_token_ids=["a"]), "stop_token_ids"),
    (chat(stream="yes"), "stream"),
    (chat(stream_options={"include_usage": True}), "stream_options"),
    (chat(stream=True, stream_options={"include_usage": "yes"}), "stream_options.include_usage"),
    (chat(ignore_eos=1), "ignore_eos"),
    (chat(min_tokens=5, max_tokens=2), "min_tokens"),
    (chat(priority="high"), "priority"),
    (chat(priority=2**40), "priority"),
    (chat(user=7), "user"),
    (chat(n=0), "n"),
    (chat(n="2"), "n"),
])
def test_malformed_fields_are_400s_naming_the_param(body: dict[str, Any], param: str) -> None:
    err = refused(body)
    assert err.param == param
    assert err.body()["error"]["param"] == param


@pytest.mark.parametrize("field, value", [
    ("best_of", 3), ("functions", [{"name": "f"}]), ("echo", True), ("suffix", "x"),
])
def test_unsupported_features_are_refused_by_name(field: str, value: Any) -> None:
    err = refused(chat(**{field: value}))
    assert err.param == field and err.code == "unsupported_parameter"
    assert field in err.message


@pytest.mark.parametrize("field, value", [
    ("n", 1), ("logprobs", False), ("logprobs", None), ("presence_penalty", 0), ("frequency_penalty", 0.0),
    ("logit_bias", {}), ("tools", []), ("response_format", {"type": "text"}), ("tool_choice", "none"),
])
def test_neutral_values_of_unsupported_features_are_accepted(field: str, value: Any) -> None:
    assert parse_request(chat(**{field: value}), Endpoint.CHAT).model == "smollm2"


def test_completion_echo_and_prompt_batches_are_refused() -> None:
    assert refused(completion(logprobs=21), Endpoint.COMPLETION).param == "logprobs"
    assert refused(completion(echo=True), Endpoint.COMPLETION).param == "echo"
    assert refused(completion(prompt=["a", "b"]), Endpoint.COMPLETION).param == "prompt"
    assert refused(completion(prompt=""), Endpoint.COMPLETION).param == "prompt"
    assert refused(completion(prompt=[]), Endpoint.COMPLETION).param == "prompt"
    assert refused(completion(prompt=[1, "a"]), Endpoint.COMPLETION).param == "prompt"
    assert refused(completion(prompt=[True]), Endpoint.COMPLETION).param == "prompt"


@pytest.mark.parametrize("raw, code", [
    (b"{bad json", "invalid_json"), (b"", "invalid_json"), (b"[1, 2]", "invalid_json"), (b"null", "invalid_json"),
    (b'{"temperature": NaN}', "invalid_json"), (b'{"a": "\xff\xfe"}', "invalid_encoding"),
    (b"[" * 100_000 + b"]" * 100_000, "json_too_deep"), (b'{"a": ' + b"[" * 65 + b"]" * 65 + b"}", "json_too_deep"),
])
def test_undecodable_bodies_are_400s(raw: bytes, code: str) -> None:
    with pytest.raises(ApiError) as caught:
        decode_body(raw, max_depth=64)
    assert caught.value.status == 400 and caught.value.code == code


def test_integral_floats_are_accepted_as_integers() -> None:
    assert parse_request(chat(max_tokens=16.0), Endpoint.CHAT).max_tokens == 16


def test_default_max_tokens_is_16_for_completions_and_at_most_the_rest_of_the_window_for_chat() -> None:
    assert resolve_max_tokens(parse_request(completion(), Endpoint.COMPLETION), 10, 100) == 16
    assert resolve_max_tokens(parse_request(chat(), Endpoint.CHAT), 10, 100) == 90
    assert resolve_max_tokens(parse_request(completion(), Endpoint.COMPLETION), 95, 100) == 5


def test_chat_without_a_limit_is_bounded_by_the_gateways_default_not_the_whole_context() -> None:
    assert resolve_max_tokens(parse_request(chat(), Endpoint.CHAT), 10, 8192) == 512


def test_max_completion_tokens_wins_on_both_endpoints() -> None:
    for body, endpoint in ((chat(max_completion_tokens=1, max_tokens=300), Endpoint.CHAT),
                           (completion(max_completion_tokens=1, max_tokens=300), Endpoint.COMPLETION)):
        assert resolve_max_tokens(parse_request(body, endpoint), 10, 8192) == 1


def test_prompt_plus_max_tokens_over_the_window_is_context_length_exceeded() -> None:
    req = parse_request(chat(max_tokens=50), Endpoint.CHAT)
    assert resolve_max_tokens(req, 50, 100) == 50
    with pytest.raises(ApiError) as caught:
        resolve_max_tokens(req, 51, 100)
    err = caught.value
    assert (err.status, err.code, err.param) == (400, "context_length_exceeded", "max_tokens")
    assert "maximum context length is 100 tokens" in err.message and "101 tokens" in err.message


def test_a_prompt_that_alone_fills_the_window_blames_the_prompt() -> None:
    with pytest.raises(ApiError) as caught:
        resolve_max_tokens(parse_request(completion(), Endpoint.COMPLETION), 100, 100)
    assert caught.value.param == "prompt" and caught.value.code == "context_length_exceeded"


def test_token_ids_outside_the_vocabulary_are_refused() -> None:
    check_token_ids([0, 9], 10, "prompt")
    with pytest.raises(ApiError) as caught:
        check_token_ids([3, 10], 10, "prompt")
    assert caught.value.param == "prompt" and "10" in caught.value.message
    with pytest.raises(ApiError):
        check_token_ids([-1], 10, "stop_token_ids")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "min_tokens", "temperature",
          "top_p", "top_k", "seed", "stop", "stop_token_ids", "stream", "stream_options", "ignore_eos", "priority",
          "n", "logprobs", "top_logprobs", "user", "cache_salt", "tools", "response_format", "logit_bias",
          "presence_penalty", "frequency_penalty", "repetition_penalty"]


@settings(max_examples=300, deadline=None)
@given(body=st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=6),
       endpoint=st.sampled_from(list(Endpoint)))
def test_any_json_object_is_parsed_or_refused_with_a_400_never_a_crash(body: dict[str, Any],
                                                                       endpoint: Endpoint) -> None:
    base = chat() if endpoint is Endpoint.CHAT else completion()
    try:
        req = parse_request({**base, **body}, endpoint)
    except ApiError as err:
        assert err.status == 400 and err.message
        return
    try:  # what the server builds next: a valid request maps to valid sampling parameters or a 400
        req.sampling_params(max(req.max_tokens or 16, req.sampling.get("min_tokens", 0), 1))
    except ApiError as err:
        assert err.status == 400


@pytest.mark.parametrize("bias", [{"²": 1}, {"-1": 1}, {"1": 101}, {"1": True}, {"1": "2"}, [1]])
def test_a_malformed_logit_bias_is_a_400_naming_it(bias: Any) -> None:
    assert refused(chat(logit_bias=bias)).param == "logit_bias"


def test_penalties_bias_and_logprobs_map_to_sampling_params() -> None:
    req = parse_request(chat(presence_penalty=0.5, frequency_penalty=-1, repetition_penalty=1.2,
                             logit_bias={"7": -100, "9": 2.5}, logprobs=True, top_logprobs=4, n=3), Endpoint.CHAT)
    params = req.sampling_params(16, {"temperature": 0.2, "presence_penalty": 0.1})
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -1.0, 1.2)
    assert params.logit_bias == {7: -100.0, 9: 2.5} and params.logprobs == 4 and req.n == 3
    assert params.temperature == 0.2  # left out: the model's default


@pytest.mark.parametrize("fields, param", [({"stop": ["x" * 300]}, "stop"), ({"stop": ["a"] * 17}, "stop"),
                                           ({"temperature": 0.5, "seed": 2**63}, "seed")])
def test_limits_only_the_sampling_params_know_are_400s_naming_the_field(fields: dict[str, Any],
                                                                        param: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_request(chat(**fields), Endpoint.CHAT).sampling_params(16)
    assert (caught.value.status, caught.value.param) == (400, param)
