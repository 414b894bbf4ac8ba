"""The Batch API end to end with the official `openai` client through the gateway to the real backend: 200 lines
all answered, and the usage and spend charged are the sums of the lines'."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal

from tests.gateway.batch.helpers import chat_lines, read_jsonl, run_batch
from tests.gateway.harness import GatewayHarness

PRICE = {"input": 1.0, "output": 2.0}  # per million tokens


async def test_two_hundred_lines_through_the_real_backend_are_answered_and_charged_as_their_sum(
        backend_url: str, gateway_for: Callable[..., Awaitable[GatewayHarness]]) -> None:
    gateway = await gateway_for([], channels=[{"name": "backend", "base_url": backend_url, "models": ["smollm2"]}],
                                timeouts={"first_token": 100.0, "total": 120.0},
                                batch={"max_in_flight": 16, "poll_interval": 0.05})
    assert (await gateway.admin.put("/admin/prices/smollm2", json=PRICE)).status_code == 200
    account_id = await gateway.account()
    key_id, secret = await gateway.key(account_id=account_id)
    client = gateway.client(secret, timeout=60)
    batch = await run_batch(client, chat_lines(200, max_tokens=3), timeout=240)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (200, 0)
    answers = await read_jsonl(client, batch.output_file_id)
    assert sorted(a["custom_id"] for a in answers) == sorted(f"line-{i}" for i in range(200))
    assert all(a["response"]["body"]["choices"][0]["message"]["content"] for a in answers)
    usages = [a["response"]["body"]["usage"] for a in answers]
    prompt = sum(u["prompt_tokens"] for u in usages)
    completion = sum(u["completion_tokens"] for u in usages)
    usage = await gateway.usage(key_id=key_id)
    assert (usage["requests"], usage["prompt_tokens"], usage["completion_tokens"]) == (200, prompt, completion)
    assert Decimal(str(usage["cost"])) == (Decimal(prompt) * 1 + Decimal(completion) * 2) / 10**6
    # one ledger record per line, under the request id its output line names
    records = (await gateway.admin.get(f"/admin/accounts/{account_id}/requests")).json()["data"]
    assert sorted(r["id"] for r in records) == sorted(a["response"]["request_id"] for a in answers)
