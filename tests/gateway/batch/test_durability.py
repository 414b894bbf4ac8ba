"""Batches survive what replicas go through: a gateway killed (SIGKILL) mid-batch and started again finishes it
with every line answered once, and two replicas sharing one redis-server never run a line twice."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import openai
import yaml

from quota import DB_NAME
from tests.backend.backend_process import BackendProcess
from tests.gateway.batch.helpers import TERMINAL, chat_lines, jsonl, read_jsonl, start_batch, wait_for_end
from tests.gateway.harness import ADMIN_KEY, GatewayHarness, settings_for
from tests.gateway.upstreams import MockUpstream
from tests.servers import ChildProcess, RedisServer, free_port, tidegate_argv
from tests.waiting import wait_until

LINES = 40


def test_a_gateway_killed_mid_batch_finishes_every_line_once_after_restart(
        shared_backend: BackendProcess, tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "admin_key": ADMIN_KEY, "data_dir": str(tmp_path / "data"), "health_check_interval": 0.5,
        "timeouts": {"first_token": 100.0, "total": 120.0},
        "channels": [{"name": "backend", "base_url": shared_backend.base_url, "models": ["smollm2"]}],
        # a short lease, so the restarted replica takes over the killed one's lines within seconds
        "batch": {"max_in_flight": 4, "lease_seconds": 2, "poll_interval": 0.1}}))
    port = free_port()
    gateway = ChildProcess(tidegate_argv("gateway", "--config", str(config), "--port", str(port)),
                           tmp_path / "gateway.log", port)
    gateway.start(health_timeout=60)
    try:
        admin = httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
        account_id = admin.post("/admin/accounts", json={"name": "acme"}).json()["id"]
        key = admin.post("/admin/keys", json={"account_id": account_id}).json()
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key["key"], max_retries=0, timeout=30)
        upload = client.files.create(file=("input.jsonl", jsonl(chat_lines(LINES, max_tokens=8))), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")

        def answered() -> int:
            counts = client.batches.retrieve(batch.id).request_counts
            return 0 if counts is None else counts.completed

        wait_until(lambda: answered() >= 5, timeout=120, what="5 lines answered")
        gateway.kill()  # SIGKILL: leases, reservations and lines in flight are left as they were
        assert 5 <= answered_after_kill(tmp_path, batch.id) < LINES
        gateway.start(health_timeout=60)
        wait_until(lambda: client.batches.retrieve(batch.id).status in TERMINAL, timeout=180,
                   what="the batch to end after the restart")
        done = client.batches.retrieve(batch.id)
        assert done.status == "completed"
        assert done.request_counts is not None and (done.request_counts.completed, done.request_counts.failed) == (
            LINES, 0)
        assert done.output_file_id is not None
        lines = [line for line in client.files.content(done.output_file_id).text.splitlines() if line]
        assert len(lines) == LINES
        assert Counter(json.loads(line)["custom_id"] for line in lines) == Counter(
            f"line-{i}" for i in range(LINES))
        # one settled request per line: the lines cut by the kill were never charged, their reruns were
        records = admin.get(f"/admin/accounts/{account_id}/requests").json()["data"]
        assert len(records) == LINES
        assert admin.get("/admin/usage", params={"key_id": key["id"]}).json()["requests"] == LINES
    finally:
        gateway.stop()


def answered_after_kill(tmp_path: Path, batch_id: str) -> int:
    """The lines the store holds answers for, read from the embedded store while no gateway runs."""
    db = sqlite3.connect(tmp_path / "data" / DB_NAME)
    try:
        (count,) = db.execute("SELECT COUNT(*) FROM batch_results WHERE batch_id = ? AND ok = 1",
                              (batch_id,)).fetchone()
    finally:
        db.close()
    return int(count)


async def test_two_replicas_on_one_redis_never_run_a_line_twice(
        redis_server: RedisServer, tmp_path: Path, upstreams: Callable[..., Awaitable[MockUpstream]]) -> None:
    upstream = await upstreams(chunk_delay=0.01)
    settings = settings_for(tmp_path, [upstream.base_url], redis_url=redis_server.url, auth_cache_ttl=0,
                            batch={"max_in_flight": 3, "poll_interval": 0.05})
    replicas = [await GatewayHarness(settings).start() for _ in range(2)]
    try:
        _, secret = await replicas[0].key()
        batch = await start_batch(replicas[0].client(secret), jsonl(chat_lines(120, max_tokens=4)))
        done = await wait_for_end(replicas[1].client(secret), batch.id, timeout=120)
        assert done.status == "completed"
        answers = await read_jsonl(replicas[1].client(secret), done.output_file_id)
        assert sorted(a["custom_id"] for a in answers) == sorted(f"line-{i}" for i in range(120))
        asked = Counter(body["messages"][0]["content"] for body in upstream.seen_bodies)
        assert len(asked) == 120 and set(asked.values()) == {1}
    finally:
        for replica in replicas:
            await replica.stop()
