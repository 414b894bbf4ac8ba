"""The cluster layer at the gateway: a full channel sends the request to another, then it waits, then 503."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import openai
import pytest

from gateway.channels.throughput import tokens_served
from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import Fault, MockUpstream
from tests.waiting import wait_until_async

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
MESSAGES = [{"role": "user", "content": "Say hello"}]
CLASSES = {"realtime": {"max_concurrency": 8, "queue_size": 8, "queue_timeout": 1.0}}


async def test_a_full_channel_bucket_routes_to_the_other_then_waits_its_queue_timeout_then_503(
        upstreams: Start, gateway_for: StartGateway) -> None:
    first, second = await upstreams(), await upstreams()
    bucket = {"rate": 0.01, "burst": 100}  # room for one request of about 70 tokens, refilled in hours
    channels = [{"name": f"c{i}", "base_url": u.base_url, "models": ["smollm2"], "token_bucket": bucket}
                for i, u in enumerate((first, second))]
    gateway = await gateway_for([], channels=channels, priority_classes=CLASSES)
    _, secret = await gateway.key()
    client = gateway.client(secret)
    for _ in range(2):
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=60)  # type: ignore[arg-type]
    assert (first.attempts, second.attempts) == (1, 1)
    listed = (await gateway.admin.get("/admin/channels")).json()["data"]
    assert [c["token_bucket"] for c in listed] == [{"rate": 0.01, "burst": 100, "rate_from": "config"}] * 2
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as refused:
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=60)  # type: ignore[arg-type]
    assert time.monotonic() - started >= 0.9  # waited its class's queue_timeout first
    assert refused.value.status_code == 503 and refused.value.code == "overloaded"
    assert int(refused.value.response.headers["retry-after"]) > 60
    assert (first.attempts, second.attempts) == (1, 1)


async def test_a_model_at_its_global_concurrency_makes_the_next_request_wait_for_a_slot(
        upstreams: Start, gateway_for: StartGateway) -> None:
    slow = await upstreams(chunk_delay=0.2)
    gateway = await gateway_for([slow], priority_classes={"realtime": {"queue_timeout": 5.0}},
                                models_limits={"smollm2": {"global_max_concurrency": 1}})
    _, secret = await gateway.key()
    client = gateway.client(secret)

    async def ask() -> float:
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
        return time.monotonic()

    started = time.monotonic()
    ends = sorted(await asyncio.gather(ask(), ask()))
    assert slow.completed == 2
    assert ends[1] - started >= 1.2  # 0.6 s each, one after the other


async def test_a_failed_attempt_gives_its_slot_back_so_the_retry_elsewhere_fits(upstreams: Start,
                                                                                gateway_for: StartGateway) -> None:
    broken, working = await upstreams(Fault.error_500), await upstreams()
    channels = [{"name": "broken", "base_url": broken.base_url, "models": ["smollm2"], "priority": 0},
                {"name": "working", "base_url": working.base_url, "models": ["smollm2"], "priority": 1}]
    gateway = await gateway_for([], channels=channels, priority_classes=CLASSES,
                                models_limits={"smollm2": {"global_max_concurrency": 1}})
    _, secret = await gateway.key()
    started = time.monotonic()
    reply = await gateway.client(secret).chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
    assert reply.choices[0].message.content and (broken.attempts, working.attempts) == (1, 1)
    assert time.monotonic() - started < 0.9  # the model's one slot came back at once, no wait for it


def test_tokens_served_sums_the_prompt_and_generation_counters_of_tidegate_and_vllm() -> None:
    page = """# HELP tidegate_backend_prompt_tokens_total Prompt tokens processed.
tidegate_backend_prompt_tokens_total{model_name="smollm2"} 120.0
tidegate_backend_prompt_tokens_created{model_name="smollm2"} 1.7e9
vllm:generation_tokens_total{model_name="x",label="a b"} 30
tidegate_backend_request_success_total{finish_reason="stop"} 4
"""
    assert tokens_served(page) == 150.0
    assert tokens_served("up 1\n") is None


async def test_rate_from_metrics_refills_at_what_the_replicas_served(upstreams: Start,
                                                                     gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    bucket = {"rate": 0.01, "burst": 200, "rate_from": "metrics"}  # alone, a bucket refilled in hours
    channels = [{"name": "c0", "base_url": upstream.base_url, "models": ["smollm2"], "token_bucket": bucket}]
    gateway = await gateway_for([], channels=channels, priority_classes={"realtime": {"queue_timeout": 3.0}},
                                health_check_interval=0.2)
    _, secret = await gateway.key()
    client = gateway.client(secret)
    for _ in range(2):  # about 96 tokens reserved each: the burst is spent
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=90)  # type: ignore[arg-type]

    async def measured() -> bool:
        channel = (await gateway.admin.get("/admin/channels")).json()["data"][0]
        return (channel["measured_tokens_per_second"] or 0) > 50

    await wait_until_async(measured, what="the channel's served tokens per second were read")
    started = time.monotonic()
    await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=90)  # type: ignore[arg-type]
    assert time.monotonic() - started < 2.5 and upstream.completed == 3
