"""The total deadline covers writing to the client: a client that stops reading a stream is cut at `total`,
its priority slot is freed and what it received is charged."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

from tests.gateway.harness import GatewayHarness
from tests.gateway.raw_http import close_quietly, connect, request_head
from tests.gateway.upstreams import MockUpstream
from tests.reliability.processes import metric_value
from tests.waiting import wait_until_async

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

    async def slot_taken() -> bool:
        return await _realtime_active(gateway) == 1

    async def slot_freed() -> bool:
        return await _realtime_active(gateway) == 0

    async def only_the_admin_connection_open() -> bool:
        return metric_value((await gateway.admin.get("/metrics")).text, "tidegate_connections_open") == 1

    try:
        await wait_until_async(slot_taken, timeout=TOTAL, what="the stream to take its slot")
        await wait_until_async(slot_freed, timeout=TOTAL + 10, what="the unread stream to free its slot")
        freed_after = time.monotonic() - started
        # the connection is dropped too, not left to a buffer the client will never drain
        await wait_until_async(only_the_admin_connection_open, timeout=10,
                               what="the stalled client's connection to close")
    finally:
        close_quietly(writer)
    # freed by the total deadline, not earlier, and not by some later timer (idle and first_token are 2 s,
    # but the upstream keeps sending, so only `total` can fire)
    assert freed_after > TOTAL - 0.5
    assert upstream.completed == 0  # cut by the deadline, not finished

    answer = await gateway.client(secret).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "again"}], max_tokens=3)
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    usage = await gateway.usage(key_id=key_id)
    assert usage["requests"] == 2 and usage["completion_tokens"] > 3  # what the stalled client got is charged
