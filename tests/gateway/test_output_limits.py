"""Output limits against the real backend: the gateway reserves one limit per request and the backend is sent
exactly that one, so a prepaid balance never goes below zero, whatever mix of limit fields and concurrency."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from tests.gateway.harness import GatewayHarness

pytestmark = pytest.mark.skipif(importlib.util.find_spec("backend.server") is None,
                                reason="backend/server.py has not landed")

StartGateway = Callable[..., Awaitable[GatewayHarness]]
# 100 per million output tokens: 0.0001 a token, so 0.015 pays for about two answers of 60 tokens
PRICE = {"input": 1.0, "output": 100.0}


async def _gateway(gateway_for: StartGateway, backend_url: str, **overrides: Any) -> GatewayHarness:
    return await gateway_for([], channels=[{"name": "backend", "base_url": backend_url, "models": ["smollm2"]}],
                             timeouts={"first_token": 100.0, "total": 120.0}, **overrides)


async def _balance(gateway: GatewayHarness, account_id: str) -> float:
    return float((await gateway.admin.get(f"/admin/accounts/{account_id}/balance")).json()["balance"])


async def test_conflicting_limit_fields_under_concurrency_never_overspend_a_small_balance(
        backend_url: str, gateway_for: StartGateway) -> None:
    gateway = await _gateway(gateway_for, backend_url)
    assert (await gateway.admin.put("/admin/prices/smollm2", json=PRICE)).status_code == 200
    account_id = await gateway.account()
    top_up = await gateway.admin.post(f"/admin/accounts/{account_id}/balance", json={"amount": 0.015})
    assert top_up.status_code == 201
    _, secret = await gateway.key(account_id=account_id)
    auth = {"authorization": f"Bearer {secret}"}
    # issue 41's attack: max_completion_tokens 1 reserved, max_tokens honoured by the backend
    conflicting = {"model": "smollm2", "max_completion_tokens": 1, "max_tokens": 60, "ignore_eos": True,
                   "temperature": 0}
    asks: list[tuple[str, dict[str, Any], int]] = [
        *[("/completions", {**conflicting, "prompt": "Count:"}, 60)] * 6,  # completions honour max_tokens
        *[("/chat/completions", {**conflicting, "messages": [{"role": "user", "content": "Count."}]}, 1)] * 6,
    ]
    async with httpx.AsyncClient(base_url=gateway.url + "/v1", headers=auth, timeout=120) as http:
        answers = await asyncio.gather(*(http.post(path, json=body) for path, body, _ in asks))
    served = 0
    for (path, _, reserved), answer in zip(asks, answers, strict=True):
        assert answer.status_code in (200, 429), answer.text
        if answer.status_code == 429:
            assert answer.json()["error"]["code"] == "insufficient_quota"
            continue
        served += 1
        assert answer.json()["usage"]["completion_tokens"] <= reserved, (path, answer.json()["usage"])
    assert served >= 1
    assert await _balance(gateway, account_id) >= 0


async def test_completions_reserve_for_every_prompt_and_a_balance_that_cannot_cover_them_is_refused(
        backend_url: str, gateway_for: StartGateway) -> None:
    gateway = await _gateway(gateway_for, backend_url)
    await gateway.admin.put("/admin/prices/smollm2", json=PRICE)
    account_id = await gateway.account()
    await gateway.admin.post(f"/admin/accounts/{account_id}/balance", json={"amount": 0.01})
    _, secret = await gateway.key(account_id=account_id)
    async with httpx.AsyncClient(base_url=gateway.url + "/v1", timeout=120,
                                 headers={"authorization": f"Bearer {secret}"}) as http:
        # 50 prompts of 4 tokens are 200 tokens (0.02): one prompt's worth would have fitted
        many = await http.post("/completions", json={"model": "smollm2", "prompt": ["Hi"] * 50, "max_tokens": 4})
    assert many.status_code == 429 and many.json()["error"]["code"] == "insufficient_quota"
    assert await _balance(gateway, account_id) == 0.01


async def test_chat_without_a_limit_is_sent_and_charged_the_gateways_default(
        backend_url: str, gateway_for: StartGateway) -> None:
    gateway = await _gateway(gateway_for, backend_url, default_max_tokens=7)
    _, secret = await gateway.key()
    chat = await gateway.client(secret, timeout=120).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Count to fifty."}],
        extra_body={"ignore_eos": True})
    assert chat.usage is not None and chat.usage.completion_tokens == 7


async def test_the_backend_honours_max_completion_tokens_on_completions(backend_url: str) -> None:
    body = {"model": "smollm2", "prompt": "Count:", "max_completion_tokens": 2, "max_tokens": 40,
            "ignore_eos": True}
    async with httpx.AsyncClient(timeout=120) as http:
        answer = (await http.post(backend_url + "/completions", json=body)).json()
    assert answer["usage"]["completion_tokens"] == 2
