"""The relay: an upstream answer passed to the client chunk by chunk, or handed to the assembly as parsed chunks,
with its usage read on the way."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from common import fast_json
from common.event_stream import DONE_EVENT, StreamEnd, data_event, error_event, json_event
from common.http_client import AnswerBroken
from gateway.errors import ApiError
from gateway.path.upstream import Answer
from gateway.records import Outcome, Usage
from gateway.sse import DONE, has_content

# what an outcome tells the channel's breaker; the client's own doing (leaving, not reading) says nothing
CHANNEL_VERDICT: dict[Outcome, bool | None] = {Outcome.ok: True, Outcome.disconnected: None,
                                               Outcome.client_stalled: None}


def usage_of(obj: Any) -> Usage | None:
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")), _count(cached))


def _count(value: Any) -> int:
    """A token count as reported; anything else (a string, a negative number) counts as none."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def rewrite_body(answer: Answer) -> tuple[bytes, Usage | None]:
    """A whole (non-streamed) answer with the public model name back in place, and its usage."""
    try:
        obj = fast_json.loads(answer.body)
    except ValueError:
        return answer.body, None
    if isinstance(obj, dict) and answer.model != answer.upstream_model and "model" in obj:
        obj["model"] = answer.model
        return json.dumps(obj, separators=(",", ":")).encode(), usage_of(obj)
    return answer.body, usage_of(obj)


def _parsed(data: bytes) -> Any:
    try:
        return fast_json.loads(data)
    except (ValueError, RecursionError):
        return None


def outcome_error(outcome: Outcome) -> ApiError:
    """What the client is told about an answer that failed after its first token."""
    if outcome is Outcome.timeout:
        return ApiError(504, "the upstream stalled past its idle or total deadline", "timeout", "upstream_timeout")
    return ApiError(502, "the upstream stream broke off before it finished", "upstream_error", "stream_cut")


class StreamRelay:
    """Passes an SSE answer through event by event under the idle and total deadlines.

    A stream that breaks after its first byte ends with an SSE `error` event and counts as a channel
    failure. Usage, requested upstream for settlement, is stripped when the client did not ask for it.
    """

    def __init__(self, answer: Answer, *, wants_usage: bool, deadline: float, idle: float):
        self.answer = answer
        self.usage: Usage | None = None
        self.chunks = 0  # token-bearing chunks: the completion-token estimate when no usage arrives
        self.outcome = Outcome.ok
        self._wants_usage = wants_usage
        self._rename = answer.model != answer.upstream_model
        self._deadline = deadline
        self._idle = idle
        self._done = False
        self._broke_off = False  # the upstream ended the stream without [DONE] and without an error of its own

    async def stream(self, before_end: Callable[[], Awaitable[None]]) -> AsyncIterator[bytes]:
        """The client's events, those of one upstream read written together; `before_end` runs before the
        last ones, so usage is settled by the time the client sees the stream end."""
        async for batch in self.batches():
            out = b"".join([event for data in batch if (event := self._transform(data))])
            if out:
                if self._done:
                    await before_end()
                yield out
        if self.outcome is Outcome.timeout or self._broke_off:
            await before_end()
            yield error_event(outcome_error(self.outcome))

    async def json_chunks(self) -> AsyncIterator[dict[str, Any]]:
        """The answer's chunks as JSON objects, their usage noted; a chunk that is not one cuts the answer."""
        async for batch in self.batches():
            payloads = [data for data in batch if data != DONE]
            # a read's chunks parsed together; one that does not parse is found by parsing them one by one
            for obj in fast_json.loads_all(payloads) or map(_parsed, payloads):
                if not isinstance(obj, dict):
                    self.outcome = Outcome.cut
                    return
                self._note(obj)
                yield obj

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """The events' data read by read, the held first events first, the rest under the idle and total
        deadlines (one per read, not per event), never past `[DONE]`; `outcome` says how the stream ended once
        this is exhausted."""
        first = self._until_done(self.answer.first_events + self.answer.read_ahead)
        if first:
            yield first
        events = self.answer.events
        while events is not None and not self._done:
            remaining = self._deadline - time.monotonic()
            try:
                async with asyncio.timeout(min(self._idle, max(remaining, 0.0))):
                    batch = await anext(events)
            except StopAsyncIteration:
                break
            except TimeoutError:
                self.outcome = Outcome.timeout
                return
            except (AnswerBroken, ValueError):
                break
            yield self._until_done(batch)
        if not self._done and self.outcome is Outcome.ok:
            self.outcome = Outcome.cut
            self._broke_off = True

    def _until_done(self, batch: list[bytes]) -> list[bytes]:
        """The events of a read up to `[DONE]`, which ends the stream: nothing after it is relayed."""
        if DONE in batch:
            self._done = True
            return batch[:batch.index(DONE) + 1]
        return batch

    def _transform(self, data: bytes) -> bytes | None:
        if data == DONE:
            self._done = True
            return DONE_EVENT
        if not self._rename and b'"usage"' not in data and b'"error"' not in data:
            self.chunks += 1
            return data_event(data)
        try:
            obj = fast_json.loads(data)
        except ValueError:
            return data_event(data)
        if not isinstance(obj, dict):
            return data_event(data)
        usage = self._note(obj)
        if not self._wants_usage:
            if usage is not None and not obj.get("choices"):
                return None
            obj.pop("usage", None)
        if self._rename and "model" in obj:
            obj["model"] = self.answer.model
        return json_event(obj)

    def _note(self, obj: dict[str, Any]) -> Usage | None:
        """Record what a chunk says about the whole: an upstream error, usage, one more generated chunk."""
        if "error" in obj:
            self.outcome = Outcome.cut
        usage = usage_of(obj)
        if usage is not None:
            self.usage = usage
        if has_content(obj):  # not the role chunk: it carries no token
            self.chunks += 1
        return usage

    async def close(self, end: StreamEnd) -> None:
        if end is StreamEnd.disconnected:
            self.outcome = Outcome.disconnected
        elif end is StreamEnd.write_timeout:
            self.outcome = Outcome.client_stalled
        await self.answer.finish(CHANNEL_VERDICT.get(self.outcome, False))
