"""The total deadline covers writing to the client: a client that stops reading a stream is cut at `total`,
its priority slot is freed and what it received is charged."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

from tests.gateway.harness import GatewayHarness
from tests.gateway.raw_http import close_quietly, connect, request_head
from tests.gateway.upstreams import MockUpstream
from tests.reliability.processes import metric_value

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
TOTAL = 3.0


async def _realtime_active(gateway: GatewayHarness) -> int:
    return int((await gateway.admin.get("/health")).json()["priority"]["realtime"]["active"])


async def test_an_unread_stream_frees_its_slot_at_the_total_deadline(upstreams: Start,
                                                                     gateway_for: StartGateway) -> None:
    upstream = await upstreams(chunk_delay=0.001, padding=65536)
    gateway = await gateway_for([upstream], timeouts={"connect": 1, "first_token": 2, "idle": 2, "total": TOTAL},
                                priority_classes={"realtime": {"max_concurrency": 1, "queue_size": 0}})
    key_id, secret = await gateway.key()
    # 64 KB tokens, 64 MB in all: more than the socket buffers of a client that does not read can take
    body = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 1000, "stream": True}).encode()
    _, writer = await connect(gateway.port, receive_buffer=4096)  # and never read
    writer.write(request_head("POST", "/v1/chat/completions", {"authorization": f"Bearer {secret}",
                                                               "content-type": "application/json"}, body) + body)
    started = time.monotonic()
    try:
        while await _realtime_active(gateway) != 1:
            assert time.monotonic() - started < TOTAL, "the stream never took its slot"
            await asyncio.sleep(0.05)
        while await _realtime_active(gateway) != 0:
            assert time.monotonic() - started < TOTAL + 3, "the unread stream still holds its slot"
            await asyncio.sleep(0.05)
        freed_after = time.monotonic() - started
        # the connection is dropped too, not left to a buffer the client will never drain (the admin one stays)
        while metric_value((await gateway.admin.get("/metrics")).text, "tidegate_connections_open") != 1:
            assert time.monotonic() - started < TOTAL + 5, "the stalled client's connection stayed open"
            await asyncio.sleep(0.05)
    finally:
        close_quietly(writer)
    assert TOTAL - 0.5 < freed_after < TOTAL + 2
    assert upstream.completed == 0  # cut by the deadline, not finished

    answer = await gateway.client(secret).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "again"}], max_tokens=3)
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    usage = await gateway.usage(key_id=key_id)
    assert usage["requests"] == 2 and usage["completion_tokens"] > 3  # what the stalled client got is charged
