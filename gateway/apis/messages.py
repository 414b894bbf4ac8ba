"""`POST /v1/messages`: Anthropic's Messages API, a `ClientWire` served as chat completions through the one path.

Requests, answers and streams are translated by `gateway.anthropic_wire`; errors take Anthropic's shape
(`{"type": "error", "error": {"type", "message"}}`) with the gateway's status and headers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from common.event_stream import named_event
from common.request_body import decode_json
from gateway.anthropic_wire import MessagesEvents, chat_request, messages_answer, messages_error
from gateway.apis.openai import read
from gateway.errors import ApiError, invalid_request
from gateway.path.client_wire import BeforeEnd, encode
from gateway.path.relay import StreamRelay, outcome_error
from gateway.records import Endpoint, OpenAIRequest, Outcome
from quota import KeyInfo


class MessagesWire:
    async def parse(self, raw: bytes, key: KeyInfo, *, classes: set[str], max_depth: int) -> OpenAIRequest:
        body = decode_json(raw, max_depth=max_depth)
        if not isinstance(body, dict):
            raise invalid_request("the body must be a JSON object")
        call = read(chat_request(body), endpoint=Endpoint.chat, classes=classes)
        call.wants_usage = True  # a Messages stream always ends with its usage
        return call

    def error_body(self, error: ApiError) -> dict[str, Any]:
        return messages_error(error)

    async def whole(self, status: int, body: bytes) -> tuple[int, bytes]:
        answer = json.loads(body)  # the gateway's own JSON: a served chat completion or its OpenAI error
        if status >= 300:
            message = str(answer.get("error", {}).get("message") or "the upstream refused the request")
            return status, encode(messages_error(ApiError(status, message)))
        try:
            return status, encode(await self.answer(answer))
        except ApiError as error:
            return error.status, encode(messages_error(error))

    async def answer(self, whole: dict[str, Any]) -> dict[str, Any]:
        try:
            return messages_answer(whole)
        except ApiError as error:  # the upstream's answer, not the client's request, is what cannot be carried
            raise ApiError(502, f"the upstream's answer cannot be sent as a message: {error.message}",
                           "upstream_error", "untranslatable_answer") from None

    async def events(self, relay: StreamRelay, before_end: BeforeEnd, model: str,
                     prompt_tokens: int) -> AsyncIterator[bytes]:
        stream = MessagesEvents(model, prompt_tokens)
        async for chunk in relay.json_chunks():
            for name, data in stream.add(chunk):
                yield named_event(name, data)
        await before_end()  # settled before the client sees the end
        if relay.outcome is Outcome.ok:
            for name, data in stream.finish():
                yield named_event(name, data)
        else:
            yield named_event("error", messages_error(outcome_error(relay.outcome)))


MESSAGES = MessagesWire()
