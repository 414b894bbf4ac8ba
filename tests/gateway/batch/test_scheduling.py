"""How batch lines share capacity: every endpoint a batch may name, the dispatcher's yielding to realtime traffic,
and one account's share, so that a long batch of one tenant does not hold back another's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from config import PriorityClass
from config.batch import BatchSettings
from gateway.batch.pressure import Pressure
from gateway.path.priority import PriorityPools
from tests.gateway.batch.helpers import chat_lines, jsonl, read_jsonl, run_batch, start_batch, wait_for_end
from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream

Start = Callable[..., Awaitable[GatewayHarness]]


def lines_for(url: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"custom_id": f"{url}-{i}", "method": "POST", "url": url, "body": body} for i, body in enumerate(bodies)]


async def test_embeddings_completions_and_responses_lines_are_answered_in_their_apis_shapes(
        upstreams: Callable[..., Awaitable[MockUpstream]], gateway_for: Start) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([], channels=[{"name": "c0", "base_url": upstream.base_url, "models": ["smollm2"],
                                               "embeddings": True}])
    _, secret = await gateway.key()
    client = gateway.client(secret)
    shapes = {"/v1/embeddings": ({"model": "smollm2", "input": "a line"}, "list"),
              "/v1/completions": ({"model": "smollm2", "prompt": "Once", "max_tokens": 3}, "text_completion"),
              "/v1/responses": ({"model": "smollm2", "input": "Hi", "max_output_tokens": 3, "store": False},
                                "response")}
    for url, (body, kind) in shapes.items():
        batch = await run_batch(client, lines_for(url, [body, body]), endpoint=url)
        answers = await read_jsonl(client, batch.output_file_id)
        assert batch.status == "completed" and len(answers) == 2, (url, batch)
        assert {a["response"]["body"]["object"] for a in answers} == {kind}


def test_the_dispatcher_halves_its_lines_while_realtime_queues_or_its_first_tokens_slow() -> None:
    pools = PriorityPools({"realtime": PriorityClass(max_concurrency=1, queue_size=4),
                           "batch": PriorityClass(max_concurrency=8)}, "realtime")
    pressure = Pressure(BatchSettings(max_in_flight=8, yield_ttft_seconds=1.0), pools, "batch")
    assert [pressure.update() for _ in range(9)] == [2, 3, 4, 5, 6, 7, 8, 8, 8]
    for _ in range(10):
        pools.get("realtime").note_first_token(2.5)  # a realtime P95 TTFT of 2.5 s, over the 1 s threshold
    assert [pressure.update() for _ in range(4)] == [4, 2, 1, 0]
    pools.get("realtime").first_tokens.clear()
    for _ in range(10):
        pools.get("realtime").note_first_token(0.2)
    assert [pressure.update() for _ in range(3)] == [1, 2, 3]


async def test_a_waiting_realtime_request_pauses_new_lines() -> None:
    pools = PriorityPools({"realtime": PriorityClass(max_concurrency=1, queue_size=4),
                           "batch": PriorityClass(max_concurrency=8)}, "realtime")
    pressure = Pressure(BatchSettings(max_in_flight=8), pools, "batch")
    for _ in range(3):
        pressure.update()
    realtime = pools.get("realtime")
    await realtime.acquire()
    waiter = asyncio.create_task(realtime.acquire())
    while realtime.queued == 0:
        await asyncio.sleep(0)
    assert pressure.pressed() and pressure.update() == 2
    realtime.release()
    await waiter
    assert not pressure.pressed()  # one in flight and none waiting: calm, unless `yield_active` says otherwise
    assert Pressure(BatchSettings(yield_active=1), pools, "batch").pressed()
    realtime.release()
    assert not Pressure(BatchSettings(yield_active=1), pools, "batch").pressed()


async def test_one_accounts_long_batch_does_not_hold_back_anothers(
        upstreams: Callable[..., Awaitable[MockUpstream]], gateway_for: Start) -> None:
    upstream = await upstreams(chunk_delay=0.02)
    gateway = await gateway_for([upstream], batch={"max_in_flight": 2, "poll_interval": 0.05})
    _, first_secret = await gateway.key()
    _, second_secret = await gateway.key()
    first, second = gateway.client(first_secret), gateway.client(second_secret)
    long = await start_batch(first, jsonl(chat_lines(200, max_tokens=8)))
    short = await wait_for_end(second, (await start_batch(second, jsonl(chat_lines(4, max_tokens=8)))).id)
    assert short.status == "completed"
    still = await first.batches.retrieve(long.id)
    # the second account's lines ran beside the first's, not after its 200
    assert still.status == "in_progress" and still.request_counts is not None
    assert still.request_counts.completed < 100
    await first.batches.cancel(long.id)
