"""`GET /admin/batches`: the batches of one account (`?account_id=`; an account admin's own by default), or, for
the platform's roles without one, every batch still running; each with its owner and live line counts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request

from gateway.admin.access import caller_of
from quota import BatchStore

Handler = Callable[[Request], Awaitable[Any]]
RUNNING = ("in_progress", "cancelling", "finalizing")
MAX_ROWS = 1000


def batch_handlers(store: BatchStore | None) -> dict[str, Handler]:
    async def list_batches(request: Request) -> dict[str, Any]:
        query = request.query_params
        account_id = query.get("account_id") or caller_of(request).tenant
        status = query.get("status")
        if store is None:
            return {"data": []}
        docs = await store.list_batches(account_id) if account_id else await store.active_batches()
        docs = [d for d in docs if status in (None, d["status"])][:MAX_ROWS]
        return {"data": [await _with_counts(store, d) for d in docs]}

    return {"batches.list": list_batches}


async def _with_counts(store: BatchStore, doc: dict[str, Any]) -> dict[str, Any]:
    row = {k: v for k, v in doc.items() if not k.startswith("_")}
    if doc["status"] in RUNNING:
        progress = await store.progress(doc["id"])
        row["request_counts"] = {**doc["request_counts"], "completed": progress.completed, "failed": progress.failed}
        row["running"] = progress.running
    return row

