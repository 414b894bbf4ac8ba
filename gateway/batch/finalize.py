"""The end of a batch: its status moves to `finalizing` (compare-and-set, so one replica wins), lines a lapsed
window left unanswered get `batch_expired` errors, the output and error files are written from the recorded
results, and the status moves to completed, expired or cancelled with the files and the final counts."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping

from gateway.batch.files import FilesApi
from gateway.batch.lines import error_line
from gateway.batch.shapes import Doc, now
from quota import BatchStore, LineResult

log = logging.getLogger("tidegate.batch")
OUTCOMES = ("completed", "expired", "cancelled")


class Finalizer:
    def __init__(self, store: BatchStore, files: FilesApi, lease_seconds: float):
        self._store = store
        self._files = files
        self._lease = lease_seconds

    async def begin(self, doc: Doc, outcome: str) -> Doc | None:
        """Claims the batch's end; None when another replica (or a cancel) changed its status first."""
        assert outcome in OUTCOMES
        return await self._store.update_batch(doc["id"], frozenset({doc["status"]}), {
            "status": "finalizing", "finalizing_at": now(), "_outcome": outcome,
            "_finalize_until": time.time() + self._lease})

    @staticmethod
    def lapsed(doc: Doc) -> bool:
        """A batch left in `finalizing` by a replica that died there."""
        return bool(doc["status"] == "finalizing" and doc.get("_finalize_until", 0) < time.time())

    async def finish(self, doc: Doc, custom_ids: Mapping[int, str]) -> Doc | None:
        batch_id, outcome = doc["id"], doc["_outcome"]
        if outcome == "expired":
            for index in await self._store.unfinished(batch_id):
                expired = error_line(custom_ids.get(index), "batch_expired",
                                     "the batch's completion window ended before this line ran")
                await self._store.record(LineResult(index, False, json.dumps(expired)), batch_id)
        results = await self._store.results(batch_id)
        answered = [r.line for r in results if r.ok]
        failed = [r.line for r in results if not r.ok]
        written = [await self._write(doc, lines, kind) for lines, kind in ((answered, "output"), (failed, "error"))]
        final = await self._store.update_batch(batch_id, frozenset({"finalizing"}), {
            "status": outcome, f"{outcome}_at": now(), "output_file_id": written[0], "error_file_id": written[1],
            "request_counts": {"total": doc["request_counts"]["total"], "completed": len(answered),
                               "failed": len(failed)}})
        if final is None:  # another replica finished it first: its files are the batch's
            for file_id in written:
                if file_id is not None:
                    await self._files.remove(file_id)
        else:
            log.info("batch %s %s: %d answered, %d failed", batch_id, outcome, len(answered), len(failed))
        return final

    async def _write(self, doc: Doc, lines: list[str], kind: str) -> str | None:
        if not lines:
            return None
        content = ("\n".join(lines) + "\n").encode()
        saved = await self._files.save(doc, content, f"{doc['id']}_{kind}.jsonl", "batch_output")
        return str(saved["id"])
