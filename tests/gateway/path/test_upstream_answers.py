"""Upstream answers a careless or hostile upstream sends: compressed, without usage, or a 4xx carrying HTML or
secrets. The client always gets plain OpenAI JSON or SSE, and every served answer is charged."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai
import pytest

from gateway.path.upstream_answers import is_safe_message
from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import LEAKED, Fault, MockUpstream

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
MESSAGES = [{"role": "user", "content": "Say hello"}]


async def test_a_gzip_upstream_is_relayed_decoded_and_billed(upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(Fault.gzip)
    gateway = await gateway_for([upstream])
    key_id, secret = await gateway.key()
    client = gateway.client(secret)
    whole = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert whole.choices[0].message.content == "t0 t1 t2 t3 " and whole.model == "smollm2"
    stream = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5,  # type: ignore[call-overload]
                                                  stream=True)
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert text == "t0 t1 t2 t3 t4 "
    usage = await gateway.usage(key_id=key_id)
    assert usage["completion_tokens"] == 4 + 5 and usage["prompt_tokens"] > 0


async def test_an_answer_without_usage_is_charged_the_estimate(upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(Fault.no_usage)
    gateway = await gateway_for([upstream])
    key_id, secret = await gateway.key()
    client = gateway.client(secret)
    await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=40)  # type: ignore[arg-type]
    stream = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=6,  # type: ignore[call-overload]
                                                  stream=True)
    async for _ in stream:
        pass
    usage = await gateway.usage(key_id=key_id)
    assert usage["requests"] == 2
    assert usage["prompt_tokens"] >= 2 * 5  # the gateway's estimate of "Say hello" in a chat frame, twice
    assert usage["completion_tokens"] >= 40 + 6  # "t0 ... t39 " is about 4 bytes a token; the stream, one a chunk


@pytest.mark.parametrize("stream", [False, True])
async def test_an_html_4xx_reaches_the_client_as_openai_json_without_the_upstreams_secrets(
        upstreams: Start, gateway_for: StartGateway, stream: bool) -> None:
    upstream = await upstreams(Fault.html_400)
    gateway = await gateway_for([upstream])
    key_id, secret = await gateway.key()
    async with httpx.AsyncClient(base_url=gateway.url, headers={"authorization": f"Bearer {secret}"}) as http:
        response = await http.post("/v1/chat/completions",
                                   json={"model": "smollm2", "messages": MESSAGES, "stream": stream})
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "HTTP 400" in error["message"]
    for leaked in ("sk-live", "10.0.3.7", "http://", "<html"):
        assert leaked not in response.text
    assert (await gateway.usage(key_id=key_id))["completion_tokens"] == 0


async def test_an_upstream_4xx_keeps_code_and_param_but_not_a_message_with_secrets(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(Fault.leaky_400)
    gateway = await gateway_for([upstream])
    _, secret = await gateway.key()
    with pytest.raises(openai.BadRequestError) as refused:
        await gateway.client(secret).chat.completions.create(model="smollm2", messages=MESSAGES)  # type: ignore[arg-type]
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "messages"
    assert LEAKED not in str(refused.value.body) and "sk-live" not in refused.value.message


def test_plain_upstream_messages_survive_and_revealing_ones_do_not() -> None:
    kept = ("This model's maximum context length is 2048 tokens. However, you requested 3000 tokens "
            "(2000 in the messages, 1000 in the completion). Please reduce the length of the messages.")
    assert is_safe_message(kept) and is_safe_message("'temperature' must be between 0 and 2")
    for revealing in (LEAKED, "bad key sk-abc123def456ghi", "see https://docs.internal", "proxy at 10.1.2.3",
                      "backend vllm-7:8000 refused", "<b>no</b>", "Authorization header invalid",
                      "file /var/lib/models/x.gguf missing", "token=abcdef", "x" * 1000, "two\nlines"):
        assert not is_safe_message(revealing), revealing


def _tools(kilobytes: int) -> list[dict[str, Any]]:
    schema = {"type": "object", "description": "x" * (kilobytes * 1024)}
    return [{"type": "function", "function": {"name": "lookup", "parameters": schema}}]


async def test_tools_and_images_raise_the_reservation(upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([upstream], image_prompt_tokens=1000)
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    with_images = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, picture, picture]}]
    cases: list[dict[str, Any]] = [{"tools": _tools(12)}, {"messages": with_images}]
    for extra in cases:
        _, secret = await gateway.key(quota={"tpm": 1500})
        client = gateway.client(secret)
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
        body: dict[str, Any] = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 4, **extra}
        with pytest.raises(openai.RateLimitError):  # about 3,000 prompt tokens cannot fit in 1,500 a minute
            await client.chat.completions.create(**body)
