"""The request path's ugly cases through HTTP: client disconnects, full priority pools, failover, caps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import Fault, MockUpstream
from tests.waiting import wait_until_async

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
MESSAGES = [{"role": "user", "content": "Say hello"}]


async def test_client_disconnect_mid_stream_releases_the_lease_and_settles_usage(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(chunk_delay=0.05)
    gateway = await gateway_for([upstream])
    key_id, secret = await gateway.key(quota={"max_concurrency": 1})
    body = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 200, "stream": True}
    auth = {"authorization": f"Bearer {secret}"}
    async with (httpx.AsyncClient(base_url=gateway.url, headers=auth) as http,
                http.stream("POST", "/v1/chat/completions", json=body) as response):
        assert response.status_code == 200
        seen = 0
        async for line in response.aiter_lines():
            seen += line.startswith("data:")
            if seen == 3:
                break  # leave mid-stream: the context exit closes the connection

    async def settled() -> dict[str, int] | None:
        usage = await gateway.usage(key_id=key_id)
        return usage if usage["requests"] == 1 else None

    usage = await wait_until_async(settled, what="the abandoned request's usage settled")
    # settled short of the full 200 tokens (10 s of stream): the gateway noticed the disconnect, not the end
    assert 1 <= usage["completion_tokens"] < 200
    channel = await wait_until_async(lambda: _first_channel(gateway), what="the channel's in-flight back to 0")
    assert channel["models"]["smollm2"]["breaker"] == "closed"
    # the key's single concurrency slot is free again
    reply = await gateway.client(secret).chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "t0 "


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_leaves_before_the_first_token_is_charged_its_prompt_and_frees_its_slot(
        upstreams: Start, gateway_for: StartGateway, stream: bool) -> None:
    upstream = await upstreams(stall_at=0)  # sends its headers and role chunk, never a token
    gateway = await gateway_for([upstream])
    key_id, secret = await gateway.key(quota={"max_concurrency": 1})
    body = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 50, "stream": stream}
    async with httpx.AsyncClient(base_url=gateway.url, headers={"authorization": f"Bearer {secret}"}) as http:
        waiting = asyncio.create_task(http.post("/v1/chat/completions", json=body))
        await wait_until_async(lambda: upstream.attempts == 1, what="the request at the upstream")
        waiting.cancel()  # the client leaves while the gateway waits for the first token
        with pytest.raises(asyncio.CancelledError):
            await waiting

    usage = await wait_until_async(lambda: _settled(gateway, key_id, 1), what="the abandoned request's usage settled")
    # accepted work is charged its prompt, never the 50 tokens it reserved and never generated
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] == 0
    await wait_until_async(lambda: upstream.abandoned == 1, what="the upstream call closed")
    # the key's single concurrency slot is free again: a second request is admitted and reaches the upstream
    async with httpx.AsyncClient(base_url=gateway.url, headers={"authorization": f"Bearer {secret}"}) as http:
        second = asyncio.create_task(http.post("/v1/chat/completions", json=body))
        await wait_until_async(lambda: upstream.attempts == 2 or second.done(), what="the second request admitted")
        assert not second.done(), second.result().text
        second.cancel()


async def test_a_full_priority_pool_queues_then_serves_in_order(upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(chunk_delay=0.1)
    gateway = await gateway_for([upstream], priority_classes={
        "realtime": {"max_concurrency": 1, "queue_size": 10, "queue_timeout": 10}})
    _, secret = await gateway.key()
    client = gateway.client(secret)
    finished: list[int] = []

    async def ask(i: int) -> None:
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
        finished.append(i)

    async def arrived(count: int) -> bool:
        # a request is queued, active, or (done at the gateway) on its way to `finished`
        pool = await _pool(gateway, "realtime")
        return pool["active"] + pool["queued"] + len(finished) >= count

    tasks = []
    for i in range(4):
        tasks.append(asyncio.create_task(ask(i)))
        await wait_until_async(lambda count=i + 1: arrived(count), what=f"request {i} at the gateway")  # a known order
    await asyncio.gather(*tasks)
    assert finished == [0, 1, 2, 3]
    assert len(upstream.seen_bodies) == 4


async def test_a_queue_timeout_answers_503_with_retry_after(upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(chunk_delay=1.0)  # the first request holds the only slot for 3 s
    gateway = await gateway_for([upstream], priority_classes={
        "realtime": {"max_concurrency": 1, "queue_size": 10, "queue_timeout": 0.3}})
    key_id, secret = await gateway.key()
    client = gateway.client(secret)
    slow = asyncio.create_task(client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3))  # type: ignore[arg-type]
    await wait_until_async(lambda: upstream.attempts == 1, what="the first request upstream, holding the slot")
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as refused:
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
    assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"] == "1"
    assert time.monotonic() - started > 0.25  # it waited its queue timeout in the queue
    assert not slow.done()  # and was refused while the slot was still taken, not served after it
    await slow
    usage = await gateway.usage(key_id=key_id)
    assert usage["completion_tokens"] == 3  # the refused request was refunded, not charged


async def test_a_client_that_leaves_the_queue_gives_its_place_back_at_once(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(stall_at=0)  # the first request holds the only slot
    gateway = await gateway_for([upstream], priority_classes={
        "realtime": {"max_concurrency": 1, "queue_size": 10, "queue_timeout": 60}})
    key_id, secret = await gateway.key()
    body = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 5, "stream": True}
    async with httpx.AsyncClient(base_url=gateway.url, headers={"authorization": f"Bearer {secret}"}) as http:
        holder = asyncio.create_task(http.post("/v1/chat/completions", json=body))
        await wait_until_async(lambda: upstream.attempts == 1, what="the first request upstream, holding the slot")
        queued = asyncio.create_task(http.post("/v1/chat/completions", json=body))
        await wait_until_async(lambda: _pool_is(gateway, "realtime", active=1, queued=1), what="one request queued")
        queued.cancel()
        # its place is given back long before the 60 s queue timeout, and it is never sent upstream
        await wait_until_async(lambda: _pool_is(gateway, "realtime", active=1, queued=0), timeout=10,
                               what="the queue empty again")
        holder.cancel()
    await wait_until_async(lambda: _pool_is(gateway, "realtime", active=0, queued=0), what="the slot free")
    assert upstream.attempts == 1
    usage = await wait_until_async(lambda: _settled(gateway, key_id, 2), what="both requests settled")
    assert usage["completion_tokens"] == 0


async def test_batch_keys_queue_in_their_own_pool_while_realtime_is_served(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(chunk_delay=0.75)  # a batch job holds its slot 1.5 s, a realtime one 0.75 s
    gateway = await gateway_for([upstream], priority_classes={
        "realtime": {"max_concurrency": 1, "queue_size": 4, "queue_timeout": 10},
        "batch": {"max_concurrency": 1, "queue_size": 4, "queue_timeout": 10}})
    _, batch_secret = await gateway.key(priority_class="batch")
    _, realtime_secret = await gateway.key()
    batch = gateway.client(batch_secret)
    batch_jobs = [asyncio.create_task(batch.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2))  # type: ignore[arg-type]
                  for _ in range(3)]
    await wait_until_async(lambda: _pool_is(gateway, "batch", active=1, queued=2), what="one batch job served, two queued")
    await gateway.client(realtime_secret).chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    assert not batch_jobs[-1].done()  # served at once, not behind the batch queue
    await asyncio.gather(*batch_jobs)


async def test_failover_through_the_gateway_reaches_the_healthy_channel_every_time(
        upstreams: Start, gateway_for: StartGateway) -> None:
    failing, hanging, healthy = await upstreams(Fault.error_500), await upstreams(Fault.hang), await upstreams()
    refusing = MockUpstream()  # never started: its port refuses connections
    gateway = await gateway_for([refusing, failing, hanging, healthy], retries={"max_attempts": 4},
                                timeouts={"connect": 0.5, "first_token": 0.5, "idle": 1, "total": 5},
                                breaker={"consecutive_failures": 2, "cooldown": 60})
    _, secret = await gateway.key()
    client = gateway.client(secret)
    async def bad_attempts() -> list[int]:
        rows = (await gateway.admin.get("/admin/channels")).json()["data"]
        return [row["models"]["smollm2"]["attempts"] for row in rows if row["name"] != "c3"]

    sent = 0
    # routing is random, so keep going (bounded) until each bad channel has had the two failures that open it
    while sent < 8 or (sent < 40 and min(await bad_attempts()) < 2):
        started = time.monotonic()
        if sent % 2:
            chunks = [c async for c in await client.chat.completions.create(
                model="smollm2", messages=MESSAGES, max_tokens=2, stream=True)]  # type: ignore[arg-type]
            assert chunks
        else:
            await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
        assert time.monotonic() - started < 5
        sent += 1
    assert healthy.completed == sent
    assert failing.attempts <= 2 and hanging.attempts <= 2
    channels = {c["name"]: c["models"]["smollm2"] for c in (await gateway.admin.get("/admin/channels")).json()["data"]}
    assert [channels[name]["breaker"] for name in ("c0", "c1", "c2", "c3")] == ["open", "open", "open", "closed"]
    metrics = (await gateway.admin.get("/metrics")).text
    assert 'tidegate_breaker_state{channel="c1",model="smollm2"} 2.0' in metrics


async def test_a_sub_account_cap_holds_across_its_keys(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    account = await gateway.account()
    team = await gateway.sub_account(account, quota={"rpm": 5})
    secrets = [(await gateway.key(sub_account_id=team))[1] for _ in range(3)]
    outcomes = []
    for i in range(12):
        try:
            await gateway.client(secrets[i % 3]).completions.create(model="smollm2", prompt="x", max_tokens=1)
            outcomes.append("ok")
        except openai.RateLimitError as error:
            assert error.response.headers["x-ratelimit-limit-requests"] == "5"
            outcomes.append("429")
    assert outcomes.count("ok") == 5
    usage = await gateway.usage(sub_account_id=team)
    assert usage["requests"] == 5


async def test_the_priority_field_picks_the_class_and_an_upstream_4xx_passes_through_uncharged(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(chunk_delay=0.75)  # each batch job holds the class's one slot for 1.5 s
    gateway = await gateway_for([upstream], priority_classes={
        "realtime": {"max_concurrency": 4}, "batch": {"max_concurrency": 1, "queue_size": 4, "queue_timeout": 10}})
    key_id, secret = await gateway.key()
    client = gateway.client(secret)
    jobs = [asyncio.create_task(client.chat.completions.create(  # type: ignore[call-overload]
        model="smollm2", messages=MESSAGES, max_tokens=2, extra_body={"priority": "batch"})) for _ in range(2)]
    await wait_until_async(lambda: _pool_is(gateway, "batch", active=1, queued=1), what="one batch job served, one queued")
    await asyncio.gather(*jobs)
    assert all("priority" not in body for body in upstream.seen_bodies)  # a class name means nothing upstream

    upstream.fault = Fault.bad_request
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as rejected:
            await client.chat.completions.create(model="smollm2", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
        assert rejected.value.code == "upstream_says_no"
    channel = (await gateway.admin.get("/admin/channels")).json()["data"][0]["models"]["smollm2"]
    assert channel["breaker"] == "closed" and channel["failures"] == 0  # the caller's fault, not the channel's
    assert (await gateway.usage(key_id=key_id))["completion_tokens"] == 4  # the two served requests only


async def test_a_long_request_keeps_its_concurrency_lease_past_the_lease_ttl(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(chunk_delay=0.1)  # a 4 s stream against a 1 s lease: it must be renewed
    gateway = await gateway_for([upstream], lease_ttl=1.0)
    _, secret = await gateway.key(quota={"max_concurrency": 1})
    client = gateway.client(secret)
    opened = time.monotonic()
    stream = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=40, stream=True)  # type: ignore[arg-type]
    chunks = []
    async for chunk in stream:  # read on, as a client would, until twice the lease TTL has passed
        chunks.append(chunk)
        if time.monotonic() - opened > 2.0:
            break
    assert len(chunks) < 40, "the stream ended before the lease TTL passed twice: nothing was tested"
    with pytest.raises(openai.RateLimitError) as refused:
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    assert "concurrency" in refused.value.message
    chunks += [chunk async for chunk in stream]
    assert len(chunks) >= 40
    await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]


async def _settled(gateway: GatewayHarness, key_id: str, requests: int) -> dict[str, int] | None:
    usage = await gateway.usage(key_id=key_id)
    return usage if usage["requests"] == requests else None


async def _pool(gateway: GatewayHarness, name: str) -> dict[str, int]:
    """A priority class's `{"active", "queued"}` as the gateway's /health reports it."""
    return dict((await gateway.admin.get("/health")).json()["priority"][name])


async def _pool_is(gateway: GatewayHarness, name: str, *, active: int, queued: int) -> bool:
    return await _pool(gateway, name) == {"active": active, "queued": queued}


async def _first_channel(gateway: GatewayHarness) -> dict[str, Any] | None:
    """The first channel's /admin/channels row once nothing is in flight on it."""
    channel: dict[str, Any] = (await gateway.admin.get("/admin/channels")).json()["data"][0]
    return channel if channel["in_flight"] == 0 else None
