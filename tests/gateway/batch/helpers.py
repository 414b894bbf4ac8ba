"""Batch input files and polling with the official `openai` client, shared by the batch tests."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from openai import AsyncOpenAI
from openai.types import Batch

TERMINAL = ("completed", "failed", "expired", "cancelled")


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def chat_lines(count: int, max_tokens: int = 4, model: str = "smollm2") -> list[dict[str, Any]]:
    return [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": model, "max_tokens": max_tokens, "temperature": 0,
                      "messages": [{"role": "user", "content": f"Count to {i}."}]}} for i in range(count)]


async def run_batch(client: AsyncOpenAI, lines: list[dict[str, Any]], endpoint: str = "/v1/chat/completions",
                    timeout: float = 120.0) -> Batch:
    return await wait_for_end(client, (await start_batch(client, jsonl(lines), endpoint)).id, timeout)


async def start_batch(client: AsyncOpenAI, content: bytes, endpoint: str = "/v1/chat/completions") -> Batch:
    upload = await client.files.create(file=("input.jsonl", content), purpose="batch")
    return await client.batches.create(input_file_id=upload.id, endpoint=endpoint,  # type: ignore[arg-type]
                                       completion_window="24h")


async def wait_for_end(client: AsyncOpenAI, batch_id: str, timeout: float = 120.0) -> Batch:
    deadline = time.monotonic() + timeout
    while True:
        batch = await client.batches.retrieve(batch_id)
        if batch.status in TERMINAL:
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} still {batch.status} after {timeout}s: {batch.request_counts}")
        await asyncio.sleep(0.2)


async def read_jsonl(client: AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [json.loads(line) for line in content.text.splitlines() if line.strip()]
