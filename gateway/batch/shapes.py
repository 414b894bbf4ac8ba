"""What a file or a batch record holds, who may see it, and its public OpenAI shape.

A record is an OpenAI object plus its owner: the account and sub-account of the key that made it (any key of
that account and sub-account sees it; every other caller gets a 404, as for an id that does not exist) and
that key, whose limits and prices its lines run under.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from gateway.errors import ApiError, not_found
from quota import KeyInfo

Doc = dict[str, Any]
OWNER_FIELDS = ("account_id", "sub_account_id", "key_id")
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
WINDOWS = {"24h": 24 * 3600}
DONE = frozenset({"completed", "failed", "expired", "cancelled"})


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


def owned_by(key: KeyInfo) -> Doc:
    return {"account_id": key.account_id, "sub_account_id": key.sub_account_id, "key_id": key.id}


def visible(doc: Doc | None, key: KeyInfo, what: str, given: str) -> Doc:
    """The record when the key's account and sub-account own it; else the 404 an unknown id gets."""
    if doc is None or doc["account_id"] != key.account_id or doc.get("sub_account_id") != key.sub_account_id:
        raise not_found(f"no {what} with id {given[:80]!r}")
    return doc


def public(doc: Doc) -> Doc:
    return {k: v for k, v in doc.items() if k not in OWNER_FIELDS and not k.startswith("_")}


def line_error(code: str, message: str, line: int | None = None) -> Doc:
    return {"code": code, "message": message, "param": None, "line": line}


def listing(docs: list[Doc], limit: int, after: str | None) -> Doc:
    """OpenAI's cursor page: `after` is the last id of the page before."""
    if after is not None:
        ids = [d["id"] for d in docs]
        docs = docs[ids.index(after) + 1:] if after in ids else []
    page = docs[:limit]
    return {"object": "list", "data": [public(d) for d in page], "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(docs) > limit}


def page_limit(raw: str | None, default: int, most: int) -> int:
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise ApiError(400, f"'limit' must be an integer from 1 to {most}", "invalid_request_error", None, "limit")
    return int(raw)
