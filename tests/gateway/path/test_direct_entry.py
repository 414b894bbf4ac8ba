"""The inference routes' direct entry answers as Starlette's layers did: errors in the OpenAI shape, the resolved
client address, the IP limit, and every other route and method through Starlette."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import httpx
import pytest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.path.direct_entry import GatewayApp
from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
CHAT = "/v1/chat/completions"


def direct(gateway: GatewayHarness) -> GatewayApp:
    assert isinstance(gateway.app, GatewayApp)
    return gateway.app


async def test_the_inference_routes_are_served_directly(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    assert set(direct(gateway).direct) == {CHAT, "/v1/completions", "/v1/messages", "/v1/embeddings"}
    _, secret = await gateway.key()
    async with httpx.AsyncClient(base_url=gateway.url, headers={"authorization": f"Bearer {secret}"}) as raw:
        answer = await raw.post(CHAT, json={"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]},
                                headers={"x-request-id": "direct-1"})
        assert answer.status_code == 200 and answer.headers["x-request-id"] == "direct-1"
        assert answer.json()["object"] == "chat.completion"
        # another method on the same path goes Starlette's way, and answers in the OpenAI shape
        wrong = await raw.get(CHAT)
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"


async def test_a_failing_endpoint_answers_500_as_starlette_would_and_is_logged(
        upstreams: Start, gateway_for: StartGateway, caplog: pytest.LogCaptureFixture) -> None:
    gateway = await gateway_for([await upstreams()])

    async def broken(request: Request) -> Response:
        raise RuntimeError("a bug")  # the fault under test

    direct(gateway).direct[CHAT] = broken
    with caplog.at_level(logging.ERROR, logger="tidegate.gateway"):
        async with httpx.AsyncClient(base_url=gateway.url) as raw:
            answer = await raw.post(CHAT, json={})
    assert answer.status_code == 500
    assert answer.json()["error"] == {"message": "internal gateway error", "type": "server_error", "param": None,
                                      "code": "internal_error"}
    assert any("unhandled error on /v1/chat/completions" in r.getMessage() for r in caplog.records)


async def test_an_http_exception_answers_through_the_routing_handler(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])

    async def refusing(request: Request) -> Response:
        raise HTTPException(404)

    direct(gateway).direct[CHAT] = refusing
    async with httpx.AsyncClient(base_url=gateway.url) as raw:
        answer = await raw.post(CHAT, json={})
        unknown = await raw.post("/v1/nowhere", json={})
    assert answer.status_code == unknown.status_code == 404
    assert answer.json() == unknown.json()


async def test_the_endpoint_sees_the_resolved_client_and_the_ip_limit_comes_first(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()], ip_rate_limit={"rpm": 2, "trusted_proxies": ["127.0.0.1"]})
    seen: list[str] = []

    async def echo(request: Request) -> Response:
        seen.append(request.client.host if request.client else "")
        return JSONResponse({"app": request.app is gateway.app})

    direct(gateway).direct[CHAT] = echo
    async with httpx.AsyncClient(base_url=gateway.url) as raw:
        forwarded = {"x-forwarded-for": "198.51.100.7"}
        answers = [await raw.post(CHAT, json={}, headers=forwarded) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].json() == {"app": True}
    assert answers[2].json()["error"]["code"] == "ip_rate_limit_exceeded"
    assert seen == ["198.51.100.7", "198.51.100.7"]
