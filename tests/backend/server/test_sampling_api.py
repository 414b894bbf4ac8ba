"""Generation defaults, logprobs, penalties and logit_bias through a real backend and the official client."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from backend.loading.generation_config import SHIPPED_TABLE
from backend.loading.tokenizer import Tokenizer
from tests.backend.backend_process import BackendProcess
from tests.waiting import wait_until

OVERRIDE = {"temperature": 0, "presence_penalty": 0.25}
MESSAGES: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(launch_backend: Callable[..., BackendProcess]) -> BackendProcess:
    return launch_backend("--override-generation-config", json.dumps(OVERRIDE)).wait_ready()


@pytest.fixture(scope="module")
def tokenizer(gguf_metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(gguf_metadata, max_context=2048)


@pytest.fixture(scope="module")
def client(server: BackendProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_models_list_the_effective_generation_defaults(server: BackendProcess) -> None:
    shipped = json.loads(SHIPPED_TABLE.read_text())["SmolLM2-135M-Instruct.Q4_1.gguf"]
    [card] = httpx.get(server.base_url + "/models").json()["data"]
    expected = {k: v for k, v in shipped.items() if not k.startswith("_")} | OVERRIDE
    assert card["generation_defaults"] == expected


def test_a_request_without_sampling_fields_gets_the_defaults(client: openai.OpenAI) -> None:
    # the override makes the default greedy: the same question answers the same way every time
    answers = {client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=8)
               .choices[0].message.content for _ in range(2)}
    assert len(answers) == 1 and "Paris" in answers.pop()  # type: ignore[operator]


def test_chat_logprobs_come_in_openais_shape(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=6, logprobs=True,
                                          top_logprobs=3, extra_body={"ignore_eos": True})
    choice = done.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert done.usage is not None and len(content) == done.usage.completion_tokens == 6
    assert "".join(t.token for t in content) == choice.message.content
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].logprob >= entry.logprob  # greedy picks the best, penalties aside
        assert bytes(entry.bytes or []) == entry.token.encode()


def test_streamed_chat_logprobs_cover_every_token(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=6, logprobs=True,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    entries, text, usage = [], "", None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None and choice.logprobs.content:
                entries += choice.logprobs.content
    assert usage is not None and len(entries) == usage.completion_tokens == 6
    assert "".join(e.token for e in entries) == text and all(e.top_logprobs == [] for e in entries)


def test_completion_logprobs_and_logit_bias(server: BackendProcess, client: openai.OpenAI,
                                            tokenizer: Tokenizer) -> None:
    plain = client.completions.create(model="smollm2", prompt="The sky is", max_tokens=1, logprobs=2)
    assert plain.choices[0].logprobs is not None and plain.choices[0].logprobs.tokens is not None
    first = plain.choices[0].logprobs.tokens[0]
    ids = httpx.post(server.base_url + "/completions", timeout=120, json={
        "model": "smollm2", "prompt": "The sky is", "max_tokens": 1, "logprobs": 0}).json()
    assert ids["choices"][0]["logprobs"]["tokens"] == [first]
    # a bias of -100 on the greedy token's id makes the model pick another
    [token_id] = tokenizer.encode(first, add_special_tokens=False)
    biased = client.completions.create(model="smollm2", prompt="The sky is", max_tokens=3, logprobs=2,
                                       logit_bias={str(token_id): -100})
    logprobs = biased.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.text_offset is not None
    assert first not in logprobs.tokens and "".join(logprobs.tokens) == biased.choices[0].text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(3)]
    assert logprobs.top_logprobs is not None and all(len(top) >= 2 for top in logprobs.top_logprobs)


def test_a_repetition_penalty_changes_a_greedy_answer(client: openai.OpenAI) -> None:
    prompt = "one one one one one one one one"
    plain = client.completions.create(model="smollm2", prompt=prompt, max_tokens=6, temperature=0,
                                      presence_penalty=0)
    penalized = client.completions.create(model="smollm2", prompt=prompt, max_tokens=6, temperature=0,
                                          presence_penalty=0, extra_body={"repetition_penalty": 5.0})
    assert penalized.choices[0].text != plain.choices[0].text


@pytest.mark.parametrize("body, param", [
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
])
def test_bad_sampling_fields_are_400s_naming_the_field(client: openai.OpenAI, body: dict[str, Any],
                                                       param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2, extra_body=body)
    assert caught.value.body["param"] == param  # type: ignore[index]


def test_an_out_of_range_default_stops_the_server_naming_the_field(
        launch_backend: Callable[..., BackendProcess]) -> None:
    bad = launch_backend("--override-generation-config", '{"temperature": 500}')
    wait_until(lambda: bad.proc is not None and bad.proc.poll() is not None, timeout=120)
    assert bad.proc is not None and bad.proc.returncode == 1 and "temperature" in bad.log()


def test_n_choices_count_the_prompt_once_and_stream_by_index(client: openai.OpenAI) -> None:
    one = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4, seed=3,
                                         temperature=1.0, extra_body={"ignore_eos": True})
    four = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4, seed=3, n=4,
                                          temperature=1.0, extra_body={"ignore_eos": True})
    assert [c.index for c in four.choices] == [0, 1, 2, 3]
    assert four.choices[0].message.content == one.choices[0].message.content  # choice 0 keeps the seed
    assert four.usage is not None and one.usage is not None
    assert (four.usage.prompt_tokens, four.usage.completion_tokens) == (one.usage.prompt_tokens, 16)
    stream = client.completions.create(model="smollm2", prompt="The sky is", max_tokens=3, n=2, stream=True,
                                       seed=5, logprobs=1, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    texts, offsets, finished, usage = {0: "", 1: ""}, {0: [], 1: []}, [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            offsets[choice.index] += (choice.logprobs.text_offset or []) if choice.logprobs else []
            if choice.finish_reason is not None:
                finished.append(choice.index)
    assert sorted(finished) == [0, 1] and usage is not None and usage.completion_tokens == 6
    assert all(len(o) == 3 and o[0] == 0 for o in offsets.values())  # each choice's text starts at 0
