"""The gateway's edge against hostile clients: slow or oversized headers, slow bodies, odd request ids, deeply
nested JSON, and what /metrics shows and to whom."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable

import httpx

from tests.gateway.harness import GatewayHarness
from tests.gateway.raw_http import close_quietly, closed_by_server, connect, read_answer, request_head
from tests.gateway.upstreams import Fault, MockUpstream
from tests.reliability.processes import metric_value
from tests.waiting import wait_until_async

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
MESSAGES = [{"role": "user", "content": "hello"}]
GENERATED_ID = re.compile(r"[0-9a-f]{32}")


async def test_slow_headers_are_cut_with_a_408_at_the_header_timeout(upstreams: Start,
                                                                     gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()], server={"header_timeout": 1.0})
    reader, writer = await connect(gateway.port)
    started = time.monotonic()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-slow: ")

    async def trickle() -> None:  # one byte every 0.1 s: never idle, never done
        while True:
            writer.write(b"a")
            await asyncio.sleep(0.1)

    sender = asyncio.create_task(trickle())
    try:
        answer = await asyncio.wait_for(read_answer(reader), 10)
    finally:
        sender.cancel()
        close_quietly(writer)
    assert answer.status == 408 and answer.json()["error"]["code"] == "request_timeout"
    assert 0.9 < time.monotonic() - started < 4.5
    text = (await gateway.admin.get("/metrics")).text
    assert metric_value(text, "tidegate_connections_closed_by_guard_total", reason="header_timeout") == 1


async def test_a_silent_connection_is_closed_at_the_header_timeout(upstreams: Start,
                                                                   gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()], server={"header_timeout": 1.0})
    reader, writer = await connect(gateway.port)
    started = time.monotonic()
    assert await asyncio.wait_for(closed_by_server(reader), 10)
    close_quietly(writer)
    assert 0.9 < time.monotonic() - started < 4.5


async def test_oversized_headers_get_a_431_before_they_are_all_sent(upstreams: Start,
                                                                    gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()], server={"max_header_bytes": 16 * 1024})
    reader, writer = await connect(gateway.port)
    writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\nx-request-id: ")
    for _ in range(16):  # 1 MB of one header value, sent without waiting; the refusal comes after 16 KB
        writer.write(b"a" * 65536)
    with contextlib.suppress(ConnectionError):
        await writer.drain()
    answer = await asyncio.wait_for(read_answer(reader), 10)
    close_quietly(writer)
    assert answer.status == 431 and answer.json()["error"]["code"] == "headers_too_large"

    # complete headers over the cap in one write are refused the same way
    reader, writer = await connect(gateway.port)
    writer.write(request_head("GET", "/health", {"x-pad": "b" * 20000}))
    answer = await asyncio.wait_for(read_answer(reader), 10)
    close_quietly(writer)
    assert answer.status == 431


async def test_malformed_http_gets_a_json_400(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    reader, writer = await connect(gateway.port)
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    answer = await asyncio.wait_for(read_answer(reader), 10)
    close_quietly(writer)
    assert answer.status == 400 and answer.json()["error"]["type"] == "invalid_request_error"


async def test_a_slow_body_gets_a_408_at_the_body_timeout(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()], server={"body_timeout": 1.0})
    _, secret = await gateway.key()
    body = json.dumps({"model": "smollm2", "prompt": "hi", "max_tokens": 2}).encode()
    reader, writer = await connect(gateway.port)
    writer.write(request_head("POST", "/v1/completions", {"authorization": f"Bearer {secret}",
                                                          "content-type": "application/json"}, body))
    writer.write(body[:5])  # and never the rest
    started = time.monotonic()
    answer = await asyncio.wait_for(read_answer(reader), 10)
    close_quietly(writer)
    assert answer.status == 408 and answer.json()["error"]["code"] == "request_timeout"
    assert 0.9 < time.monotonic() - started < 4.5


async def test_only_well_formed_request_ids_are_kept(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    _, secret = await gateway.key()
    body = {"model": "smollm2", "prompt": "hi", "max_tokens": 2}
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        for given, kept in [("req-1.A_b", True), ("a" * 128, True), ("a" * 129, False), ("x" * 20000, False),
                            ("has space", False), ("semi;colon", False), ("<script>", False)]:
            for auth in (f"Bearer {secret}", "Bearer wrong"):  # served, and refused with a 401
                response = await client.post("/v1/completions", json=body,
                                             headers={"authorization": auth, "x-request-id": given})
                assert response.status_code == (200 if auth.endswith(secret) else 401)
                echoed = response.headers["x-request-id"]
                assert echoed == given if kept else GENERATED_ID.fullmatch(echoed), (given[:20], echoed)


async def test_deeply_nested_json_is_a_400_on_every_body(upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([upstream])
    _, secret = await gateway.key()
    auth = {"authorization": f"Bearer {secret}", "content-type": "application/json"}
    deep = "[" * 800 + "]" * 800
    deeper = "[" * 100_000 + "]" * 100_000
    bodies = [
        ("/v1/completions", f'{{"model":"smollm2","max_tokens":2,"prompt":{deep}}}'),
        ("/v1/completions", f'{{"model":"smollm2","max_tokens":2,"prompt":{deeper}}}'),
        ("/v1/chat/completions", f'{{"model":"smollm2","messages":[{{"role":"user","content":{deep}}}]}}'),
    ]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        for path, raw in bodies:
            response = await client.post(path, content=raw, headers=auth)
            assert response.status_code == 400, response.text[:200]
            assert response.json()["error"]["code"] == "json_too_deep"
        response = await gateway.admin.post("/admin/accounts", content=f'{{"name":"a","quota":{deep}}}')
        assert response.status_code == 400 and response.json()["error"]["code"] == "json_too_deep"
        # moderate nesting (token-id prompts, tool schemas) still passes
        fine = await client.post("/v1/completions", headers=auth,
                                 json={"model": "smollm2", "max_tokens": 2, "prompt": [[1, 2, 3], [4, 5]]})
        assert fine.status_code == 200
    assert upstream.attempts == 1


async def test_refused_requests_add_no_metric_series(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    _, secret = await gateway.key(models=["smollm2"])
    auth = {"authorization": f"Bearer {secret}"}

    async def refused(client: httpx.AsyncClient, tag: str) -> None:
        """One of each refusal, every client-chosen value unique to `tag`."""
        for model in (f"unknown-{tag}", f"{tag}-" + "m" * 100_000):  # a 404, and a 400 for the long name
            response = await client.post("/v1/chat/completions", headers=auth,
                                         json={"model": model, "messages": MESSAGES})
            assert response.status_code in (400, 403)
        response = await client.post("/v1/chat/completions", headers={"authorization": f"Bearer tg-{tag}"},
                                     json={"model": f"m-{tag}", "messages": MESSAGES})
        assert response.status_code == 401
        assert (await client.get(f"/v1/{tag}", headers=auth)).status_code == 404
        assert (await client.post("/v1/completions", headers=auth, content=b"{" + tag.encode())).status_code == 400

    def series(text: str) -> set[str]:
        return {line.rpartition(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}

    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        await refused(client, "warmup")
        before = (await client.get("/metrics")).text
        for i in range(20):
            await refused(client, f"probe{i}")
        after = (await client.get("/metrics")).text
    assert series(after) == series(before)
    assert "probe" not in after and len(after) < 2 * len(before)
    assert metric_value(after, "tidegate_requests_total", model="other", status="403") == 21


async def test_metrics_token_and_per_account_series_can_be_required_and_switched_off(
        upstreams: Start, gateway_for: StartGateway) -> None:
    token = "metrics-token-for-tests"
    gateway = await gateway_for([await upstreams()], metrics_token=token, metrics_per_account=False)
    account = await gateway.account()
    _, secret = await gateway.key(account_id=account)
    await gateway.client(secret).completions.create(model="smollm2", prompt="hi", max_tokens=3)
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        assert (await client.get("/metrics")).status_code == 401
        wrong = await client.get("/metrics", headers={"authorization": "Bearer not-the-token"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_metrics_token"
        text = (await client.get("/metrics", headers={"authorization": f"Bearer {token}"})).text
    assert metric_value(text, "tidegate_tokens_total", account="all", kind="completion") == 3
    assert account not in text


async def test_at_the_connection_cap_with_every_connection_busy_a_new_one_gets_a_503(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(Fault.hang)
    gateway = await gateway_for([upstream], server={"max_connections": 4},
                                timeouts={"first_token": 5, "idle": 5, "total": 5})
    _, secret = await gateway.key()
    body = json.dumps({"model": "smollm2", "prompt": "hi", "max_tokens": 2}).encode()
    request = request_head("POST", "/v1/completions", {"authorization": f"Bearer {secret}"}, body) + body
    busy = []
    try:
        for n in range(1, 5):  # four requests in progress; the idle admin connection made room for the last
            reader, writer = await connect(gateway.port)
            writer.write(request)
            busy.append(writer)
            await wait_until_async(lambda n=n: upstream.attempts >= n, timeout=20,
                                   what=f"request {n} to reach the upstream")
        reader, writer = await connect(gateway.port)
        answer = await asyncio.wait_for(read_answer(reader), 10)
        close_quietly(writer)
    finally:
        for writer in busy:
            close_quietly(writer)
    assert answer.status == 503 and answer.json()["error"]["code"] == "too_many_connections"
    assert answer.headers["retry-after"] == "1"
    text = (await gateway.admin.get("/metrics")).text  # the busy ones are gone: room for this one again
    assert metric_value(text, "tidegate_connections_closed_by_guard_total", reason="too_many_connections") == 1
    assert metric_value(text, "tidegate_connections_closed_by_guard_total", reason="made_room") == 1


async def test_a_body_trickling_after_its_answer_is_cut_at_the_header_timeout(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()], server={"header_timeout": 1.0})
    reader, writer = await connect(gateway.port)
    writer.write(request_head("POST", "/v1/completions", {"authorization": "Bearer tg-wrong",
                                                          "content-length": "1000000"}))
    answer = await asyncio.wait_for(read_answer(reader), 10)
    assert answer.status == 401
    started = time.monotonic()

    async def trickle() -> None:
        while True:
            writer.write(b"a")
            await asyncio.sleep(0.1)

    sender = asyncio.create_task(trickle())
    try:
        assert await asyncio.wait_for(closed_by_server(reader), 10)
    finally:
        sender.cancel()
        close_quietly(writer)
    assert time.monotonic() - started < 4.5
