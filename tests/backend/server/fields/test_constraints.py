"""Structured-output and tool fields of a request: any JSON value in them is a 400 naming a field, or accepted
and renderable; never a crash."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from backend.server.api_errors import ApiError
from backend.server.protocol import Endpoint, parse_request
from backend.server.tools import prompt_messages

FIELDS = ["response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
          "guided_grammar", "tools", "tool_choice", "parallel_tool_calls"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    | st.sampled_from(["function", "json_schema", "json_object", "text", "object", "required", "auto"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["type", "function", "name", "parameters", "json_schema", "schema", "json", "regex",
                         "choice", "properties", "not", "$ref", "strict"]), inner, max_size=3),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), json_values, min_size=1, max_size=3),
       st.lists(st.fixed_dictionaries({"role": st.sampled_from(["tool", "assistant"]), "content": json_values,
                                       "tool_calls": json_values}), max_size=2))
def test_any_json_in_the_constraint_and_tool_fields_is_accepted_or_a_400(
        fields: dict[str, Any], extra_messages: list[dict[str, Any]]) -> None:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}, *extra_messages], **fields}
    try:
        req = parse_request(body, Endpoint.CHAT)
    except ApiError as err:
        assert err.status == 400 and err.param
        return
    assert req.messages is not None
    assert prompt_messages(req.messages, req.tools)  # what is accepted renders
    req.output_constraint  # noqa: B018 - and builds its grammar source
