"""The Responses API: `POST /v1/responses` served as a chat completion through the proxy's one request path (each
request's `ResponseTurn` is its `ClientWire`), and `GET`/`DELETE /v1/responses/{id}` reading or forgetting a
stored response, for keys of its account only."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from common.event_stream import named_event
from common.request_body import decode_json
from common.request_id import request_id as request_id_of
from gateway.apis.mcp_entry import served_or_read
from gateway.apis.openai import read, request_model
from gateway.apis.responses.answer import ResponseFrame, answer_response
from gateway.apis.responses.events import Event, ResponseEvents
from gateway.apis.responses.mcp_loop import McpTurns
from gateway.apis.responses.mcp_tools import has_mcp_tools
from gateway.apis.responses.request import chat_body
from gateway.apis.responses.store import ResponseStore, StoredResponse
from gateway.auth import authenticate
from gateway.errors import ApiError, invalid_request, unavailable
from gateway.mcp.calls import McpCalls
from gateway.path.client_wire import BeforeEnd, encode
from gateway.path.proxy import Proxy
from gateway.path.relay import StreamRelay, outcome_error
from gateway.records import Endpoint, OpenAIRequest, Outcome
from quota import KeyInfo, QuotaService

log = logging.getLogger("tidegate.gateway")
KEPT = ("completed", "incomplete")  # a failed response cannot be continued


class ResponsesApi:
    def __init__(self, proxy: Proxy, quota: QuotaService, store: ResponseStore, mcp: McpCalls | None = None):
        self._proxy = proxy
        self._quota = quota
        self.store = store
        self._mcp = None if mcp is None else McpTurns(proxy, store, mcp)

    def routes(self) -> list[Route]:
        return [Route("/v1/responses", self.create, methods=["POST"]),
                Route("/v1/responses/{response_id}", self.retrieve, methods=["GET"]),
                Route("/v1/responses/{response_id}", self.delete, methods=["DELETE"])]

    async def create(self, request: Request) -> Response:
        if self._mcp is None:
            return await self._proxy.serve(request, ResponseTurn(self.store))
        try:
            read = await served_or_read(self._proxy, self._quota, request, ResponseTurn(self.store), has_mcp_tools)
            if isinstance(read, Response):
                return read
            key, body = read
            previous = body.get("previous_response_id")
            if previous is not None and not isinstance(previous, str):
                raise invalid_request("'previous_response_id' must be a string", "previous_response_id")
            history = [] if previous is None else (await owned(self.store, previous, key, "previous_response_id")).items
            return await self._mcp.answer(request, body, key, history, ResponseTurn)
        except ApiError as error:
            return error.response(request_id_of(request.headers))

    async def retrieve(self, request: Request) -> Response:
        return await self._on_stored(request, forget=False)

    async def delete(self, request: Request) -> Response:
        """Forgets a stored response (its conversation with it) before its time to live ends."""
        return await self._on_stored(request, forget=True)

    async def _on_stored(self, request: Request, forget: bool) -> Response:
        request_id = request_id_of(request.headers)
        response_id = request.path_params["response_id"]
        try:
            key = await authenticate(self._quota, request)
            stored = await owned(self.store, response_id, key, "response_id")
            if forget:
                await self._forget(response_id)
        except ApiError as error:
            return error.response(request_id)
        body = {"id": response_id, "object": "response.deleted", "deleted": True} if forget else stored.response
        return JSONResponse(body, headers={"x-request-id": request_id})

    async def _forget(self, response_id: str) -> None:
        try:
            await self.store.delete(response_id)
        except Exception:  # as in `owned`: the store failed, the client may retry
            log.exception("deleting response %s failed", response_id[:80])
            raise store_unavailable() from None


def store_unavailable() -> ApiError:
    return unavailable("the response store is unavailable; retry shortly", 1.0, "store_unavailable")


async def owned(store: ResponseStore, response_id: str, key: KeyInfo, param: str) -> StoredResponse:
    """A stored response of the key's account; another account's is as absent as one never stored."""
    try:
        stored = await store.get(response_id)
    except Exception:  # Redis or the disk failed between auth and here: the client may retry, it is not a bug
        log.exception("reading response %s failed", response_id[:80])
        raise store_unavailable() from None
    if stored is None or stored.account_id != key.account_id:
        raise ApiError(404, f"no response with id {response_id[:80]!r} (never stored, expired, or stored with "
                       "store: false)", "invalid_request_error", "response_not_found", param)
    return stored


class ResponseTurn:
    """One Responses request, a `ClientWire` of its own: read into a chat request (`parse`), its answer translated
    back and, unless `store` is false, kept with the conversation so far. Errors keep OpenAI's shape."""

    def __init__(self, store: ResponseStore):
        self._store = store
        self._account_id = ""
        self._keep = True
        self._items: list[dict[str, Any]] = []
        self.frame = ResponseFrame("", {})

    async def parse(self, raw: bytes, key: KeyInfo, *, classes: set[str], max_depth: int) -> OpenAIRequest:
        body = decode_json(raw, max_depth=max_depth)
        model = request_model(body)
        keep = body.get("store", True)
        if not isinstance(keep, bool):
            raise invalid_request("'store' must be a boolean", "store")
        stored_fields(body)
        if keep and await self._store_full(key.account_id, len(raw)):
            raise ApiError(429, "this account's stored responses have reached their limit: send store: false, or "
                           "delete stored responses (DELETE /v1/responses/{id})", "insufficient_quota",
                           "response_storage_full", "store")
        previous = body.get("previous_response_id")
        history: list[dict[str, Any]] = []
        if previous is not None:
            if not isinstance(previous, str):
                raise invalid_request("'previous_response_id' must be a string", "previous_response_id")
            history = (await owned(self._store, previous, key, "previous_response_id")).items
        chat, self._items = chat_body(body, history)
        self._account_id, self._keep = key.account_id, keep
        self.frame = ResponseFrame(model, body)
        return read(chat, endpoint=Endpoint.chat, classes=classes)

    async def _store_full(self, account_id: str, asked: int) -> bool:
        """Whether the account's stored responses leave no room for one the size of this request."""
        try:
            return await self._store.used(account_id) + asked > self._store.cap
        except Exception:  # the store is out of reach: storing the answer will fail on its own, not the request
            log.warning("could not read the stored bytes of account %s", account_id)
            return False

    def error_body(self, error: ApiError) -> dict[str, Any]:
        return error.body()

    async def whole(self, status: int, body: bytes) -> tuple[int, bytes]:
        if status >= 300:  # the gateway's OpenAI error is the Responses API's too
            return status, body
        return status, encode(await self.answer(json.loads(body)))  # a served chat completion, checked as JSON

    async def answer(self, whole: dict[str, Any]) -> dict[str, Any]:
        response = answer_response(self.frame, whole)
        await self._kept(response)
        return response

    async def events(self, relay: StreamRelay, before_end: BeforeEnd, model: str,
                     prompt_tokens: int) -> AsyncIterator[bytes]:
        translator = ResponseEvents(self.frame)
        for event in translator.start():
            yield _sse(event)
        async for chunk in relay.json_chunks():
            for event in translator.add(chunk):
                yield _sse(event)
        await before_end()
        if relay.outcome is not Outcome.ok:
            for event in translator.fail(outcome_error(relay.outcome)):
                yield _sse(event)
            return
        last = translator.finish()
        if translator.final is not None:
            await self._kept(translator.final)
        for event in last:
            yield _sse(event)

    async def _kept(self, response: dict[str, Any]) -> None:
        if not self._keep or response["status"] not in KEPT:
            return
        try:
            if not await self._store.put(self.frame.id, StoredResponse(self._account_id, response,
                                                                       [*self._items, *response["output"]])):
                response["store"] = False  # past the account's cap: answered, but not kept
                log.warning("response %s not stored: account %s is at its stored-bytes cap", self.frame.id,
                            self._account_id)
        except Exception:  # the answer stands; only continuing from it will fail
            log.exception("storing response %s failed", self.frame.id)


def stored_fields(body: dict[str, Any]) -> None:
    """OpenAI's bounds on what is stored with a response: 16 metadata pairs of 64/512 characters, a user of 256."""
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in metadata.items())):
        raise invalid_request("'metadata' must be an object of at most 16 pairs: keys of at most 64 characters, "
                              "string values of at most 512", "metadata")
    for name in ("user", "safety_identifier"):
        value = body.get(name)
        if value is not None and not (isinstance(value, str) and len(value) <= 256):
            raise invalid_request(f"'{name}' must be a string of at most 256 characters", name)


def _sse(event: Event) -> bytes:
    return named_event(event["type"], event)
