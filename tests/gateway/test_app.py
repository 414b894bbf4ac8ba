"""The gateway end to end with the official openai client: routes, errors, usage settled exactly once."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

import openai
import pytest

from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import Fault, MockUpstream

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
MESSAGES = [{"role": "user", "content": "Say hello"}]


async def test_chat_and_completions_streamed_and_not_settle_usage_once_each(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([upstream])
    key_id, secret = await gateway.key()
    client = gateway.client(secret)

    chat = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
    assert chat.model == "smollm2" and chat.choices[0].message.content == "t0 t1 t2 "
    text = await client.completions.create(model="smollm2", prompt="Once upon", max_tokens=4)
    assert text.choices[0].text == "t0 t1 t2 t3 " and text.usage is not None
    pieces = []
    stream = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5, stream=True)  # type: ignore[arg-type]
    async for chunk in stream:
        assert chunk.usage is None  # the client did not ask for usage: the gateway's own request is hidden
        pieces += [c.delta.content or "" for c in chunk.choices]
    assert "".join(pieces) == "t0 t1 t2 t3 t4 "
    stream2 = await client.completions.create(model="smollm2", prompt="x", max_tokens=2, stream=True,
                                              stream_options={"include_usage": True})
    usages = [chunk.usage async for chunk in stream2 if chunk.usage is not None]
    assert len(usages) == 1 and usages[0].completion_tokens == 2

    assert all(body["model"] == "upstream-smollm2" for body in upstream.seen_bodies)
    usage = await gateway.usage(key_id=key_id)
    assert usage["requests"] == 4
    assert usage["completion_tokens"] == 3 + 4 + 5 + 2


async def test_models_lists_only_what_the_key_may_use(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    _, everything = await gateway.key()
    _, limited = await gateway.key(models=["other"])
    assert [m.id async for m in gateway.client(everything).models.list()] == ["smollm2"]
    assert [m.id async for m in gateway.client(limited).models.list()] == []


async def test_bad_key_forbidden_model_unknown_model_and_rate_limit_raise_the_sdk_classes(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    with pytest.raises(openai.AuthenticationError):
        await gateway.client("tg-not-a-key").chat.completions.create(model="smollm2", messages=MESSAGES)  # type: ignore[arg-type]
    _, limited = await gateway.key(models=["other"])
    with pytest.raises(openai.PermissionDeniedError):
        await gateway.client(limited).chat.completions.create(model="smollm2", messages=MESSAGES)  # type: ignore[arg-type]
    _, secret = await gateway.key(quota={"rpm": 1})
    client = gateway.client(secret)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="nope", messages=MESSAGES)  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"
    await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as limited_error:
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    headers = limited_error.value.response.headers
    assert float(headers["retry-after"]) >= 1 and headers["x-ratelimit-limit-requests"] == "1"
    assert headers["x-ratelimit-remaining-requests"] == "0" and "x-request-id" in headers
    _, bursty = await gateway.key(quota={"request_bucket": {"rate": 0.5, "burst": 1}})
    await gateway.client(bursty).chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as bucket_error:
        await gateway.client(bursty).chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    assert bucket_error.value.code == "rate_limit_exceeded" and "key's request_bucket" in bucket_error.value.message
    assert 1 <= float(bucket_error.value.response.headers["retry-after"]) <= 2


async def test_malformed_bodies_get_openai_shaped_400s_and_413(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()], max_body_bytes=2048)
    _, secret = await gateway.key()
    auth = {"authorization": f"Bearer {secret}"}
    cases = [b"{not json", b"[1, 2]", b'{"messages": []}', b'{"model": "smollm2", "messages": "hi"}',
             b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
             b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
             b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "priority": "vip"}']
    for body in cases:
        response = await gateway.admin.post("/v1/chat/completions", content=body, headers=auth)
        assert response.status_code == 400, body
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    big = b'{"model": "smollm2", "prompt": "' + b"x" * 4096 + b'"}'
    response = await gateway.admin.post("/v1/completions", content=big, headers=auth)
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"


async def test_a_stream_cut_halfway_reaches_the_client_as_an_sse_error(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams(Fault.cut)])
    key_id, secret = await gateway.key()
    stream = await gateway.client(secret).chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=8, stream=True)  # type: ignore[arg-type]
    received = []
    with pytest.raises(openai.APIError, match="broke off"):
        async for chunk in stream:
            received.append(chunk)
    assert len(received) >= 4  # the first half arrived before the error
    channels = (await gateway.admin.get("/admin/channels")).json()["data"]
    assert channels[0]["models"]["smollm2"]["failures"] == 1
    usage = await gateway.usage(key_id=key_id)
    assert usage["requests"] == 1 and usage["completion_tokens"] >= 4  # what was generated is charged


async def test_an_upstream_500_everywhere_is_a_502_and_is_not_charged(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams(Fault.error_500)], retries={"max_attempts": 2})
    key_id, secret = await gateway.key()
    with pytest.raises(openai.InternalServerError) as failed:
        await gateway.client(secret).chat.completions.create(model="smollm2", messages=MESSAGES)  # type: ignore[arg-type]
    assert failed.value.status_code == 502
    usage = await gateway.usage(key_id=key_id)
    assert usage["completion_tokens"] == 0 and usage["prompt_tokens"] == 0


async def test_each_request_gets_one_log_line_with_its_key_id_and_never_the_secret(
        upstreams: Start, gateway_for: StartGateway, caplog: pytest.LogCaptureFixture) -> None:
    gateway = await gateway_for([await upstreams()])
    key_id, secret = await gateway.key()
    caplog.set_level(logging.INFO, logger="tidegate.gateway.access")
    response = await gateway.client(secret).chat.completions.with_raw_response.create(
        model="smollm2", messages=MESSAGES, max_tokens=2, extra_headers={"x-request-id": "req-42"})  # type: ignore[arg-type]
    assert response.headers["x-request-id"] == "req-42"
    with pytest.raises(openai.AuthenticationError):
        await gateway.client("tg-wrong").completions.create(model="smollm2", prompt="x")
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "tidegate.gateway.access"]
    assert len(lines) == 2
    served, refused = lines
    assert served["request_id"] == "req-42" and served["key_id"] == key_id and served["status"] == 200
    assert (served["channel"], served["attempts"], served["completion_tokens"]) == ("c0", 1, 2)
    assert refused["status"] == 401 and refused["key_id"] is None
    assert secret not in caplog.text and "tg-wrong" not in caplog.text
