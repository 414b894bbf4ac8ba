"""The Batch API with the official `openai` client against scripted upstreams: every line answered once and
charged like an online request, per-line errors in the error file, ownership, cancel and expiry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest

from quota import open_batch_store
from tests.gateway.batch.helpers import chat_lines, jsonl, read_jsonl, run_batch, start_batch, wait_for_end
from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream

Start = Callable[..., Awaitable[GatewayHarness]]


async def test_every_line_is_answered_once_in_the_batch_class_and_charged(
        upstreams: Callable[..., Awaitable[MockUpstream]], gateway_for: Start) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([upstream])
    key_id, secret = await gateway.key()
    client = gateway.client(secret)
    batch = await run_batch(client, chat_lines(30))
    assert batch.status == "completed"
    assert batch.request_counts is not None and (batch.request_counts.total, batch.request_counts.completed,
                                                 batch.request_counts.failed) == (30, 30, 0)
    answers = await read_jsonl(client, batch.output_file_id)
    assert sorted(a["custom_id"] for a in answers) == sorted(f"line-{i}" for i in range(30))
    assert all(a["response"]["status_code"] == 200 for a in answers)
    assert batch.error_file_id is None
    # each line went upstream once, in the batch class (its upstream priority), and settled in the ledger
    assert upstream.attempts == 30
    assert {body.get("priority") for body in upstream.seen_bodies} == {1}
    usage = await gateway.usage(key_id=key_id)
    assert usage["requests"] == 30
    assert usage["prompt_tokens"] == sum(a["response"]["body"]["usage"]["prompt_tokens"] for a in answers)
    assert usage["completion_tokens"] == sum(a["response"]["body"]["usage"]["completion_tokens"] for a in answers)
    with pytest.raises(openai.ConflictError):
        await client.batches.cancel(batch.id)
    metrics = (await gateway.admin.get("/metrics")).text
    assert 'tidegate_batch_lines_total{outcome="answered"} 30.0' in metrics
    assert "tidegate_batch_lines_in_flight 0.0" in metrics


async def test_malformed_lines_go_to_the_error_file_and_the_rest_run(
        upstreams: Callable[..., Awaitable[MockUpstream]], gateway_for: Start) -> None:
    gateway = await gateway_for([await upstreams()])
    _, secret = await gateway.key()
    client = gateway.client(secret)
    good = chat_lines(3)
    content = jsonl(good[:2]) + b"{not json\n" + jsonl([{"custom_id": "no-body", "method": "POST",
                                                          "url": "/v1/chat/completions"}, good[0],
                                                         {**good[2], "url": "/v1/embeddings"}])
    content += jsonl([{**good[2], "custom_id": "unknown-model", "body": {**good[2]["body"], "model": "nope"}}])
    batch = await wait_for_end(client, (await start_batch(client, content)).id)
    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (7, 2, 5)
    errors = await read_jsonl(client, batch.error_file_id)
    codes = sorted((e["error"] or {}).get("code") or str(e["response"]["status_code"]) for e in errors)
    assert codes == ["404", "duplicate_custom_id", "invalid_body", "invalid_json", "mismatched_url"]
    assert {e["custom_id"] for e in errors} >= {"unknown-model", "no-body", "line-0"}


async def test_another_account_or_sub_account_sees_neither_files_nor_batches(
        upstreams: Callable[..., Awaitable[MockUpstream]], gateway_for: Start) -> None:
    gateway = await gateway_for([await upstreams()])
    account_id = await gateway.account()
    _, owner_secret = await gateway.key(account_id=account_id)
    _, colleague_secret = await gateway.key(account_id=account_id)
    _, other_secret = await gateway.key()
    _, team_secret = await gateway.key(sub_account_id=await gateway.sub_account(account_id))
    owner, colleague = gateway.client(owner_secret), gateway.client(colleague_secret)
    batch = await run_batch(owner, chat_lines(2))
    assert batch.output_file_id is not None
    # another key of the same account (and sub-account) sees it: records belong to the account, not the key
    assert (await colleague.batches.retrieve(batch.id)).id == batch.id
    for other in (gateway.client(other_secret), gateway.client(team_secret)):
        for call in (other.files.retrieve(batch.input_file_id), other.files.content(batch.output_file_id),
                     other.files.delete(batch.input_file_id), other.batches.retrieve(batch.id),
                     other.batches.cancel(batch.id)):
            with pytest.raises(openai.NotFoundError):
                await call
        with pytest.raises(openai.NotFoundError):
            await other.batches.create(input_file_id=batch.input_file_id, endpoint="/v1/chat/completions",
                                       completion_window="24h")
        assert [f.id for f in (await other.files.list()).data] == []
        assert [b.id async for b in other.batches.list()] == []
    assert [b.id async for b in owner.batches.list()] == [batch.id]


async def test_bad_uploads_and_batch_requests_are_4xx(
        upstreams: Callable[..., Awaitable[MockUpstream]], gateway_for: Start) -> None:
    gateway = await gateway_for([await upstreams()], batch={"max_file_bytes": 2048, "max_lines": 3})
    _, secret = await gateway.key()
    client = gateway.client(secret)
    with pytest.raises(openai.APIStatusError) as too_large:
        await client.files.create(file=("input.jsonl", jsonl(chat_lines(40))), purpose="batch")
    assert too_large.value.status_code == 413
    with pytest.raises(openai.BadRequestError):
        await client.files.create(file=("input.jsonl", jsonl(chat_lines(1))), purpose="fine-tune")
    upload = await client.files.create(file=("input.jsonl", jsonl(chat_lines(4))), purpose="batch")
    with pytest.raises(openai.BadRequestError):
        await client.batches.create(input_file_id=upload.id, endpoint="/v1/moderations",  # type: ignore[arg-type]
                                    completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        await client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                    completion_window="1h")  # type: ignore[arg-type]
    # more lines than allowed: the batch is created failed, with the reason in its errors
    batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
    assert batch.status == "failed"
    assert batch.errors is not None and batch.errors.data is not None
    assert batch.errors.data[0].code == "too_many_lines"
    response = await gateway.admin.post("/v1/batches", content=b"[1]", headers={"authorization": f"Bearer {secret}"})
    assert response.status_code == 400 and "error" in response.json()


async def test_cancel_stops_new_lines_at_once(upstreams: Callable[..., Awaitable[MockUpstream]],
                                              gateway_for: Start) -> None:
    upstream = await upstreams(chunk_delay=0.05)
    gateway = await gateway_for([upstream], batch={"max_in_flight": 1})
    _, secret = await gateway.key()
    client = gateway.client(secret)
    created = await start_batch(client, jsonl(chat_lines(200, max_tokens=8)))
    cancelling = await client.batches.cancel(created.id)
    assert cancelling.status == "cancelling"
    batch = await wait_for_end(client, created.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    answered = await read_jsonl(client, batch.output_file_id)
    assert len(answered) < 10  # only lines already running when the cancel came
    assert upstream.attempts == len(answered)
    assert (await client.batches.cancel(batch.id)).status == "cancelled"


async def test_lines_left_when_the_window_ends_are_reported_expired(
        upstreams: Callable[..., Awaitable[MockUpstream]], gateway_for: Start) -> None:
    upstream = await upstreams(chunk_delay=0.05)
    gateway = await gateway_for([upstream], batch={"max_in_flight": 1})
    _, secret = await gateway.key()
    client = gateway.client(secret)
    created = await start_batch(client, jsonl(chat_lines(100, max_tokens=8)))
    store = open_batch_store(gateway.settings)  # the window is a day: move its end to now instead of waiting
    try:
        assert await store.update_batch(created.id, frozenset({"in_progress"}), {"expires_at": 0}) is not None
    finally:
        await store.close()
    batch = await wait_for_end(client, created.id)
    assert batch.status == "expired" and batch.expired_at is not None
    answered = await read_jsonl(client, batch.output_file_id)
    expired = await read_jsonl(client, batch.error_file_id)
    assert len(answered) + len(expired) == 100
    assert {e["error"]["code"] for e in expired} == {"batch_expired"}
    assert batch.request_counts is not None and batch.request_counts.failed == len(expired) > 50


async def test_admins_list_an_accounts_batches_and_account_admins_only_their_own(
        upstreams: Callable[..., Awaitable[MockUpstream]], gateway_for: Start) -> None:
    gateway = await gateway_for([await upstreams()])
    account_id, other_account = await gateway.account(), await gateway.account()
    _, secret = await gateway.key(account_id=account_id)
    batch = await run_batch(gateway.client(secret), chat_lines(3))
    listed = (await gateway.admin.get("/admin/batches", params={"account_id": account_id})).json()["data"]
    assert [(b["id"], b["status"], b["request_counts"]["completed"], b["key_id"] is not None) for b in listed] == [
        (batch.id, "completed", 3, True)]
    created = await gateway.admin.post("/admin/admin-keys",
                                       json={"role": "account_admin", "account_id": other_account})
    other_admin = {"authorization": f"Bearer {created.json()['key']}"}
    assert (await gateway.admin.get("/admin/batches", headers=other_admin)).json()["data"] == []
    refused = await gateway.admin.get("/admin/batches", params={"account_id": account_id}, headers=other_admin)
    assert refused.status_code == 404  # as for any other tenant's record: not even its existence shows


async def test_uploads_that_are_not_multipart_files_are_refused_in_the_openai_shape(
        upstreams: Callable[..., Awaitable[MockUpstream]], gateway_for: Start) -> None:
    gateway = await gateway_for([await upstreams()])
    _, secret = await gateway.key()
    auth = {"authorization": f"Bearer {secret}"}
    cases = [({"content": b'{"purpose": "batch"}', "headers": {**auth, "content-type": "application/json"}}, 400),
             ({"data": {"purpose": "batch", "file": "not a file"}, "headers": auth}, 400),
             ({"content": b"--x\r\nbroken", "headers": {**auth, "content-type": "multipart/form-data"}}, 400),
             ({"files": {"file": ("a.jsonl", b"\n\n")}, "data": {"purpose": "batch"}, "headers": auth}, 400),
             ({"files": {"file": ("a.jsonl", b"{}")}, "data": {"purpose": "batch"}, "headers": {}}, 401)]
    for request, status in cases:
        response = await gateway.admin.post("/v1/files", **request)
        assert response.status_code == status, (request, response.text)
        assert set(response.json()["error"]) >= {"message", "type", "code"}
    listed = await gateway.admin.get("/v1/files", params={"limit": "0"}, headers=auth)
    assert listed.status_code == 400


async def test_a_line_that_keeps_breaking_the_path_fails_after_three_tries_and_the_rest_complete(
        upstreams: Callable[..., Awaitable[MockUpstream]], gateway_for: Start) -> None:
    gateway = await gateway_for([await upstreams()], batch={"retry_delay": 0})
    runner = gateway.state().batch.dispatcher._runner
    real_run, tries = runner.run, []

    async def breaks_on_poison(endpoint: str, line: Any, key: Any) -> Any:
        if line.custom_id == "poison":  # the fault under test: a bug in the path that raises for one line
            tries.append(line.index)
            raise RuntimeError("a bug in the path")
        return await real_run(endpoint, line, key)

    runner.run = breaks_on_poison
    _, secret = await gateway.key()
    client = gateway.client(secret)
    lines = chat_lines(3)
    batch = await run_batch(client, [*lines[:2], {**lines[2], "custom_id": "poison"}], timeout=60)
    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    assert len(tries) == 3
    [error] = await read_jsonl(client, batch.error_file_id)
    assert (error["custom_id"], error["error"]["code"]) == ("poison", "line_crashed")
