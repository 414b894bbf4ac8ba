"""One streamed request against an OpenAI-compatible server, timed chunk by chunk.

SSE is parsed here rather than by a client library, so each chunk is stamped the moment its bytes
arrive, and the send time is taken from httpx's trace hook when the request headers actually go out.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.realistic import transcript
from bench.records import MeasuredRequest
from bench.workloads import Message, RequestSpec


@dataclass(slots=True)
class Target:
    """The server under test. `base_url` is its root; a trailing /v1 is tolerated."""

    base_url: str
    model: str
    api_key: str | None = None
    endpoint: str = "/v1/completions"
    timeout: float = 300.0  # whole-request deadline in seconds
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"--base-url must start with http:// or https://, got {self.base_url!r}")
        if self.endpoint not in ("/v1/completions", "/v1/chat/completions"):
            raise ValueError("--endpoint must be /v1/completions or /v1/chat/completions")
        if self.timeout <= 0:
            raise ValueError("--timeout must be positive")

    @property
    def chat(self) -> bool:
        return self.endpoint == "/v1/chat/completions"

    @property
    def url(self) -> str:
        root = self.base_url.rstrip("/")
        return (root.removesuffix("/v1") if root.endswith("/v1") else root) + self.endpoint

    def body(self, spec: RequestSpec, history: list[Message]) -> dict[str, Any]:
        """The JSON body for `spec`, after the earlier turns of its conversation."""
        body: dict[str, Any] = {"model": self.model, "stream": True, "stream_options": {"include_usage": True},
                                "temperature": 0.0}
        system = [{"role": "system", "content": spec.system}] if spec.system else []
        messages = system + list(history) + (
            [{"role": "user", "content": spec.prompt}] if isinstance(spec.prompt, str) else spec.prompt)
        if self.chat:
            body["messages"] = messages
            limit_key = "max_completion_tokens"
        elif spec.natural:
            body["prompt"] = transcript(messages)
            body["stop"] = ["\nUser:"]  # the answer ends where the model would start the user's next turn
            limit_key = "max_tokens"
        else:
            body["prompt"] = "".join(m["content"] for m in messages)
            limit_key = "max_tokens"
        if spec.output_len is not None:
            body[limit_key] = spec.output_len
            if self.ignore_eos and not spec.natural:  # a real prompt's answer ends where the model ends it
                body["ignore_eos"] = True
        return body


class StreamingClient:
    """Sends requests over one pooled httpx.AsyncClient and fills in their records."""

    def __init__(self, target: Target, max_connections: int | None = None) -> None:
        self.target = target
        headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
        self.http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(target.timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def send(self, body: dict[str, Any], record: MeasuredRequest, t0: float) -> None:
        """Stream one request; `t0` is the run's perf_counter origin. Never raises for a failed request.

        A request that dies on a reused kept-alive connection before any byte of an answer came back (the
        server had closed it while it sat idle in the pool, as llama.cpp's server does) is sent once more on a
        fresh connection and marked `retried`; any other failure, or a second one, counts as failed."""
        try:
            async with asyncio.timeout(self.target.timeout):
                try:
                    await self._attempt(self.http, body, record, t0)
                except _STALE_CONNECTION as exc:
                    if record.status is not None or not record.reused_connection:
                        raise
                    record.retried = True
                    record.error_detail = f"first attempt: {type(exc).__name__}: {exc}"
                    async with httpx.AsyncClient(headers=self.http.headers, timeout=self.http.timeout) as fresh:
                        await self._attempt(fresh, body, record, t0)
        except TimeoutError:
            record.error = "timeout"
        except httpx.ConnectError as exc:
            record.error, record.error_detail = "connect_error", str(exc)
        except httpx.TimeoutException as exc:
            record.error, record.error_detail = "timeout", type(exc).__name__
        except httpx.HTTPError as exc:
            record.error, record.error_detail = "transport_error", f"{type(exc).__name__}: {exc}"
        finally:
            record.end = time.perf_counter() - t0

    async def _attempt(self, http: httpx.AsyncClient, body: dict[str, Any], record: MeasuredRequest,
                       t0: float) -> None:
        record.reused_connection = True  # until the trace shows a new connection being opened

        async def trace(name: str, info: dict[str, Any]) -> None:
            if name.startswith("connection.connect_tcp"):
                record.reused_connection = False
            elif name.endswith("send_request_headers.started") and record.sent is None:
                record.sent = time.perf_counter() - t0

        async with http.stream("POST", self.target.url, json=body, extensions={"trace": trace}) as response:
            record.status = response.status_code
            if response.status_code != 200:
                detail = await response.aread()
                record.error = str(response.status_code)
                record.error_detail = detail.decode("utf-8", "replace")[:300]
                return
            await _read_stream(response, record, t0)


# What a write to, or a read from, a connection the server already closed raises before any answer.
_STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


async def _read_stream(response: httpx.Response, record: MeasuredRequest, t0: float) -> None:
    buffer = b""
    done = False
    async for data in response.aiter_bytes():
        now = time.perf_counter() - t0
        buffer += data.replace(b"\r\n", b"\n")
        while (cut := buffer.find(b"\n\n")) >= 0:
            event, buffer = buffer[:cut], buffer[cut + 2 :]
            done = _handle_event(event.decode("utf-8", "replace"), record, now) or done
            if record.error is not None:
                return
    if not record.usage_reported:
        record.output_tokens = len(record.chunk_times)  # one token per chunk is the best guess left
    if record.error is None and not done:
        record.error, record.error_detail = "truncated", "the stream closed without data: [DONE]"
    elif record.error is None and not record.chunk_times:
        record.error = "no_tokens"


def _handle_event(event: str, record: MeasuredRequest, now: float) -> bool:
    """Apply one SSE event to `record`; True when it is the final [DONE]."""
    kind = "message"
    data_lines = []
    for line in event.split("\n"):
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data_lines.append(line[5:].removeprefix(" "))
    if not data_lines:
        return False
    data = "\n".join(data_lines)
    if data.strip() == "[DONE]":
        return True
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        record.error, record.error_detail = "stream_error", f"unparsable chunk: {data[:200]}"
        return False
    if kind == "error" or (isinstance(chunk, dict) and "error" in chunk):
        record.error = "stream_error"
        record.error_detail = json.dumps(chunk.get("error", chunk) if isinstance(chunk, dict) else chunk)[:300]
        return False
    if not isinstance(chunk, dict):
        return False
    choices = chunk.get("choices") or []
    if choices and isinstance(choices[0], dict):
        choice = choices[0]
        text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
        if text:
            record.chunk_times.append(now)
            record.text += text
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        record.usage_reported = True
        record.output_tokens = int(usage.get("completion_tokens") or 0)
        record.input_tokens = int(usage.get("prompt_tokens") or record.input_tokens)
        details = usage.get("prompt_tokens_details")
        record.cached_tokens = int((details.get("cached_tokens") if isinstance(details, dict) else 0) or 0)
    return False
