"""`/v1/files`: upload (multipart, purpose `batch`, JSONL up to `batch.max_file_bytes`), list, retrieve, delete,
and read a file's content; a caller sees only its account's and sub-account's files."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from common.request_id import request_id as request_id_of
from config.batch import BatchSettings
from gateway.auth import authenticate
from gateway.batch.folder import FileFolder
from gateway.batch.shapes import Doc, listing, new_id, now, owned_by, page_limit, public, visible
from gateway.errors import ApiError, invalid_request
from quota import BatchStore, KeyInfo, QuotaService

log = logging.getLogger("tidegate.batch")
UPLOAD_PURPOSES = ("batch",)
FORM_OVERHEAD = 64 * 1024  # the multipart boundaries and headers around the file itself

Handler = Callable[[Request, KeyInfo], Awaitable[Response]]


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the file is larger than {limit} bytes", "invalid_request_error", "file_too_large", "file")


def keyed(quota: QuotaService, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A route whose caller's key is authenticated first; every refusal answers in the OpenAI shape."""

    async def route(request: Request) -> Response:
        request_id = request_id_of(request.headers)
        try:
            response = await handler(request, await authenticate(quota, request))
        except ApiError as error:
            return error.response(request_id)
        response.headers["x-request-id"] = request_id
        return response

    return route


class FilesApi:
    def __init__(self, settings: BatchSettings, quota: QuotaService, store: BatchStore, folder: FileFolder):
        self._settings = settings
        self._quota = quota
        self._store = store
        self.folder = folder

    def routes(self) -> list[Route]:
        return [Route("/v1/files", keyed(self._quota, self.upload), methods=["POST"]),
                Route("/v1/files", keyed(self._quota, self.list), methods=["GET"]),
                Route("/v1/files/{file_id}", keyed(self._quota, self.retrieve), methods=["GET"]),
                Route("/v1/files/{file_id}", keyed(self._quota, self.delete), methods=["DELETE"]),
                Route("/v1/files/{file_id}/content", keyed(self._quota, self.content), methods=["GET"])]

    async def upload(self, request: Request, key: KeyInfo) -> Response:
        limit = self._settings.max_file_bytes
        declared = request.headers.get("content-length")
        if declared is None or not declared.isdigit():
            raise ApiError(411, "an upload needs a Content-Length header", "invalid_request_error", "length_required")
        if int(declared) > limit + FORM_OVERHEAD:
            raise too_large(limit)
        try:
            async with request.form(max_files=1, max_fields=8) as form:
                purpose, upload = form.get("purpose"), form.get("file")
                if purpose not in UPLOAD_PURPOSES:
                    raise invalid_request(f"'purpose' must be one of {list(UPLOAD_PURPOSES)}", "purpose")
                if not isinstance(upload, UploadFile):
                    raise invalid_request("'file' must be an uploaded file", "file")
                content = await upload.read(limit + 1)
                filename = (upload.filename or "upload.jsonl")[:255]
        except HTTPException as error:  # a malformed multipart body
            raise invalid_request(f"the upload is not valid multipart/form-data: {error.detail}") from None
        if len(content) > limit:
            raise too_large(limit)
        if not content.strip():
            raise invalid_request("the file is empty", "file")
        doc = await self.save(key, content, filename, str(purpose))
        return JSONResponse(public(doc))

    async def save(self, owner: KeyInfo | Doc, content: bytes, filename: str, purpose: str) -> Doc:
        """Writes the content, then its record (the owner's: a key, or the record of the batch it belongs to)."""
        file_id = new_id("file-")
        whose = owned_by(owner) if isinstance(owner, KeyInfo) else {k: owner[k] for k in ("account_id",
                                                                                          "sub_account_id", "key_id")}
        doc = {"id": file_id, "object": "file", "bytes": len(content), "created_at": now(), "expires_at": None,
               "filename": filename, "purpose": purpose, "status": "processed", "status_details": None, **whose}
        await self.folder.write(file_id, content)
        await self._store.put_file(doc)
        return doc

    async def list(self, request: Request, key: KeyInfo) -> Response:
        query = request.query_params
        docs = [d for d in await self._store.list_files(key.account_id) if d.get("sub_account_id") ==
                key.sub_account_id and query.get("purpose") in (None, d["purpose"])]
        if query.get("order") == "asc":
            docs.reverse()
        return JSONResponse(listing(docs, page_limit(query.get("limit"), 10_000, 10_000), query.get("after")))

    async def retrieve(self, request: Request, key: KeyInfo) -> Response:
        return JSONResponse(public(await self.owned(request, key)))

    async def delete(self, request: Request, key: KeyInfo) -> Response:
        doc = await self.owned(request, key)
        await self.remove(doc["id"])
        return JSONResponse({"id": doc["id"], "object": "file", "deleted": True})

    async def remove(self, file_id: str) -> None:
        await self._store.delete_file(file_id)
        await self.folder.delete(file_id)

    async def content(self, request: Request, key: KeyInfo) -> Response:
        doc = await self.owned(request, key)
        content = await self.folder.read(doc["id"])
        if content is None:
            log.error("the content of file %s is missing from %s", doc["id"], self.folder.path)
            raise ApiError(404, "the file's content is gone", "invalid_request_error", "file_content_missing")
        return Response(content, media_type="application/octet-stream")

    async def owned(self, request: Request, key: KeyInfo) -> Doc:
        file_id = request.path_params["file_id"]
        return visible(await self._store.get_file(file_id), key, "file", file_id)
