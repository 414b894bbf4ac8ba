"""The chat template renders exactly as transformers' `apply_chat_template` does."""

from __future__ import annotations

from typing import Any

import pytest

from backend.loading.chat_template import ChatTemplate, ChatTemplateError
from backend.loading.tokenizer import Tokenizer

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another, in 中文 please 🎨"},
    ],
    [{"role": "user", "content": "  spaces and\nnewlines\n\n  "}],
    [{"role": "user", "content": "Hi", "name": None}],
    [{"role": "user", "content": ""}],
]


@pytest.fixture(scope="module")
def ours(gguf_metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(gguf_metadata, max_context=8192)


@pytest.fixture(scope="module")
def reference(hf_tokenizer: Any) -> Any:
    return hf_tokenizer


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_render_equals_transformers(ours: Tokenizer, reference: Any, index: int, generation_prompt: bool) -> None:
    messages = CONVERSATIONS[index]
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    assert ours.apply_chat_template(messages, add_generation_prompt=generation_prompt) == expected


def test_rendered_prompt_tokenizes_like_transformers(ours: Tokenizer, reference: Any) -> None:
    messages = CONVERSATIONS[2]
    expected = reference.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(expected, dict) or hasattr(expected, "input_ids"):
        expected = expected["input_ids"]
    assert ours.encode(ours.apply_chat_template(messages), add_special_tokens=False) == list(expected)


def test_raise_exception_becomes_chat_template_error() -> None:
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="first message must be from the user"):
        template.render([{"role": "assistant", "content": "hi"}])


def test_tojson_keeps_non_ascii_and_html_characters() -> None:
    template = ChatTemplate("{{ messages[0] | tojson }}|{{ tools | tojson(indent=2) }}")
    out = template.render([{"role": "user", "content": "<b>é</b>"}], tools=[{"a": 1}])
    assert out == '{"role": "user", "content": "<b>é</b>"}|[\n  {\n    "a": 1\n  }\n]'


def test_trim_and_lstrip_blocks_follow_transformers() -> None:
    template = ChatTemplate("  {% for m in messages %}\n[{{ m['content'] }}]\n  {% endfor %}\n")
    assert template.render([{"content": "a"}, {"content": "b"}]) == "[a]\n[b]\n"


def test_special_tokens_are_visible_to_the_template() -> None:
    template = ChatTemplate("{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}", {"bos_token": "<s>", "eos_token": "</s>"})
    assert template.render([{"role": "user", "content": "x"}]) == "<s>x</s>"


def test_loop_controls_are_enabled() -> None:
    template = ChatTemplate("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m['content'] }}{% endfor %}")
    assert template.render([{"content": "a"}, {"content": "b"}]) == "a"


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": 5}],
        ["not a dict"],
        [{"content": "no role"}],
    ],
)
def test_malformed_messages_raise_chat_template_error(ours: Tokenizer, messages: list[Any]) -> None:
    with pytest.raises(ChatTemplateError):
        ours.apply_chat_template(messages)


def test_sandbox_blocks_attribute_escapes() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        template.render([])


def test_template_that_does_not_compile_is_refused() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
