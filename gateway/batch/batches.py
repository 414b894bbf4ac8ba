"""`/v1/batches`: create a batch from an uploaded file (read and checked at once: lines that are not requests go
to the error file, a file over `max_lines` fails the batch), list, retrieve and cancel; OpenAI's shapes and
states. A caller sees only its account's and sub-account's batches."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from common.request_body import decode_json, read_body
from config.batch import BatchSettings
from gateway.batch.files import FilesApi, keyed
from gateway.batch.lines import read_lines
from gateway.batch.shapes import (
    ENDPOINTS,
    WINDOWS,
    Doc,
    line_error,
    listing,
    new_id,
    now,
    owned_by,
    page_limit,
    public,
    visible,
)
from gateway.errors import ApiError, invalid_request
from quota import BatchStore, KeyInfo, LineResult, QuotaService

MAX_METADATA = 16  # OpenAI's: 16 pairs, keys up to 64 and values up to 512 characters


class BatchesApi:
    def __init__(self, settings: BatchSettings, quota: QuotaService, store: BatchStore, files: FilesApi):
        self._settings = settings
        self._quota = quota
        self._store = store
        self._files = files

    def routes(self) -> list[Route]:
        return [Route("/v1/batches", keyed(self._quota, self.create), methods=["POST"]),
                Route("/v1/batches", keyed(self._quota, self.list), methods=["GET"]),
                Route("/v1/batches/{batch_id}", keyed(self._quota, self.retrieve), methods=["GET"]),
                Route("/v1/batches/{batch_id}/cancel", keyed(self._quota, self.cancel), methods=["POST"])]

    async def create(self, request: Request, key: KeyInfo) -> Response:
        body = decode_json(await read_body(request, max_bytes=64 * 1024, timeout=30.0), max_depth=16)
        if not isinstance(body, dict):
            raise invalid_request("the body must be a JSON object")
        endpoint, window = body.get("endpoint"), body.get("completion_window")
        if endpoint not in ENDPOINTS:
            raise invalid_request(f"'endpoint' must be one of {list(ENDPOINTS)}", "endpoint")
        if window not in WINDOWS:
            raise invalid_request(f"'completion_window' must be one of {list(WINDOWS)}", "completion_window")
        metadata = _metadata(body.get("metadata"))
        file_id = body.get("input_file_id")
        if not isinstance(file_id, str):
            raise invalid_request("'input_file_id' must be a file id", "input_file_id")
        source = visible(await self._store.get_file(file_id), key, "file", file_id)
        if source["purpose"] != "batch":
            raise invalid_request("the input file's purpose must be 'batch'", "input_file_id")
        content = await self._files.folder.read(file_id)
        if content is None:
            raise ApiError(404, "the input file's content is gone", "invalid_request_error", "file_content_missing")
        created = now()
        doc: Doc = {"id": new_id("batch_"), "object": "batch", "endpoint": endpoint, "errors": None,
                    "input_file_id": file_id, "completion_window": window, "status": "in_progress",
                    "output_file_id": None, "error_file_id": None, "created_at": created, "in_progress_at": created,
                    "expires_at": created + WINDOWS[window], "finalizing_at": None, "completed_at": None,
                    "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
                    "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata,
                    **owned_by(key)}
        # a file of up to max_file_bytes is parsed off the event loop, which serves realtime requests meanwhile
        read = await asyncio.to_thread(read_lines, content, endpoint, self._settings.max_line_bytes)
        if read.total > self._settings.max_lines:
            doc.update(status="failed", in_progress_at=None, failed_at=created, errors={"object": "list", "data": [
                line_error("too_many_lines", f"the file has {read.total} lines; a batch may have at most "
                           f"{self._settings.max_lines}")]})
            await self._store.create_batch(doc, [], [])
            return JSONResponse(public(doc))
        doc["request_counts"]["total"] = read.total
        refused = [LineResult(i, False, json.dumps(line)) for i, line in read.errors.items()]
        await self._store.create_batch(doc, [line.index for line in read.lines], refused)
        return JSONResponse(await self._view(doc))

    async def list(self, request: Request, key: KeyInfo) -> Response:
        docs = [d for d in await self._store.list_batches(key.account_id) if d.get("sub_account_id") ==
                key.sub_account_id]
        page = listing(docs, page_limit(request.query_params.get("limit"), 20, 100),
                       request.query_params.get("after"))
        page["data"] = [await self._view(d) for d in page["data"]]
        return JSONResponse(page)

    async def retrieve(self, request: Request, key: KeyInfo) -> Response:
        return JSONResponse(await self._view(await self._owned(request, key)))

    async def cancel(self, request: Request, key: KeyInfo) -> Response:
        """Stops new lines at once; lines already running finish, then the batch is `cancelled` with their
        answers in its output file."""
        doc = await self._owned(request, key)
        changed = await self._store.update_batch(doc["id"], frozenset({"validating", "in_progress"}),
                                                 {"status": "cancelling", "cancelling_at": now()})
        if changed is None:
            current = await self._store.get_batch(doc["id"]) or doc
            if current["status"] not in ("cancelling", "cancelled"):
                raise ApiError(409, f"the batch is {current['status']} and can no longer be cancelled",
                               "invalid_request_error", "batch_not_cancellable")
            changed = current
        return JSONResponse(await self._view(changed))

    async def _owned(self, request: Request, key: KeyInfo) -> Doc:
        batch_id = request.path_params["batch_id"]
        return visible(await self._store.get_batch(batch_id), key, "batch", batch_id)

    async def _view(self, doc: Doc) -> Doc:
        """The public batch, its counts read live while its lines still run."""
        view = public(doc)
        if doc["status"] in ("in_progress", "cancelling", "finalizing") and doc["request_counts"]["total"]:
            progress = await self._store.progress(doc["id"])
            view["request_counts"] = {"total": doc["request_counts"]["total"], "completed": progress.completed,
                                      "failed": progress.failed}
        return view


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if (not isinstance(value, dict) or len(value) > MAX_METADATA
            or not all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                       for k, v in value.items())):
        raise invalid_request(f"'metadata' must be at most {MAX_METADATA} string pairs (keys up to 64 characters, "
                              "values up to 512)", "metadata")
    return value
