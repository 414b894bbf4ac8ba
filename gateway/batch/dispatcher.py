"""One background task per replica that moves batches along: it leases free lines and runs them (as many as
`Pressure` allows, shared fairly between accounts), renews their leases while they run, records each answer once,
and ends batches that are done, cancelled or past their window.

Replicas coordinate only through the store: a line is leased by one replica at a time, a lease that is not
renewed lapses (a killed replica's lines run again elsewhere), and a result is written only once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import time
from collections import defaultdict

from config.batch import BatchSettings
from gateway.batch.finalize import Finalizer
from gateway.batch.folder import FileFolder
from gateway.batch.line_runner import Answered, LineRunner
from gateway.batch.lines import Line, error_line, read_lines
from gateway.batch.metrics import BatchMetrics
from gateway.batch.pressure import Pressure
from gateway.batch.shapes import Doc, new_id
from quota import BatchStore, LineResult, QuotaService

log = logging.getLogger("tidegate.batch")
STOP_GRACE = 5.0  # seconds a stopping replica waits for its lines in flight
CRASH_LIMIT = 3  # a line that makes the gateway fail this often on one replica fails, instead of every window


class Dispatcher:
    def __init__(self, settings: BatchSettings, store: BatchStore, quota: QuotaService, folder: FileFolder,
                 runner: LineRunner, pressure: Pressure, finalizer: Finalizer, metrics: BatchMetrics):
        self._settings = settings
        self._store = store
        self._quota = quota
        self._folder = folder
        self._runner = runner
        self.pressure = pressure
        self._finalizer = finalizer
        self._metrics = metrics
        metrics.in_flight.set_function(lambda: len(self._running))
        self.owner = f"{socket.gethostname()}-{os.getpid()}-{new_id('')}"
        self._running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._lines: dict[str, dict[int, Line] | None] = {}  # batch id -> its lines as read (None: file gone)
        self._ending: set[str] = set()
        self._crashes: dict[tuple[str, int], int] = {}  # (batch, line) -> times running it raised here
        self._turn = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Leases nothing more and lets the lines in flight finish for a few seconds: a line cut here is charged its
        prompt (the upstream had begun) and runs again once its lease lapses."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._running:
            await asyncio.wait(list(self._running.values()), timeout=STOP_GRACE)
        lines = list(self._running.values())
        for task in lines:
            task.cancel()
        await asyncio.gather(*lines, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # a store outage: try again next poll, never let the loop die
                log.exception("the batch dispatcher's poll failed")
            await asyncio.sleep(self._settings.poll_interval)

    async def tick(self) -> None:
        batches = await self._store.active_batches()
        runnable = []
        for doc in batches:
            if doc["id"] in self._ending:
                continue
            if doc["status"] == "in_progress":
                if doc["expires_at"] <= time.time():
                    self._end(doc, "expired")
                elif (await self._store.progress(doc["id"])).unfinished == 0:
                    self._end(doc, "completed")
                else:
                    runnable.append(doc)
            elif doc["status"] == "cancelling" and not self._runs(doc["id"]):
                if (await self._store.progress(doc["id"])).running == 0:
                    self._end(doc, "cancelled")
            elif self._finalizer.lapsed(doc):
                self._end(doc, doc["_outcome"], claimed=True)
        self._forget_ended({doc["id"] for doc in batches})
        allowed = self.pressure.update()
        self._metrics.allowed.set(allowed)
        await self._fill(runnable, allowed - len(self._running))

    async def _fill(self, batches: list[Doc], room: int) -> None:
        """Leases lines round-robin over accounts, each up to its share of the lines in flight first, then any
        account up to the whole room, so one tenant's batch cannot starve another's."""
        if room <= 0 or not batches:
            return
        by_account: dict[str, list[Doc]] = defaultdict(list)
        for doc in batches:
            by_account[doc["account_id"]].append(doc)
        accounts = list(by_account)
        self._turn = (self._turn + 1) % len(accounts)
        accounts = accounts[self._turn:] + accounts[:self._turn]
        in_flight: dict[str, int] = defaultdict(int)
        for batch_id, _ in self._running:
            in_flight[batch_id] += 1
        per_account = {a: sum(in_flight[d["id"]] for d in docs) for a, docs in by_account.items()}
        drained: set[str] = set()
        share = math.ceil(self._settings.max_in_flight / len(accounts))
        for cap in (share, self._settings.max_in_flight):
            leased = True
            while room > 0 and leased:
                leased = False
                for account in accounts:
                    if room > 0 and per_account[account] < cap and await self._lease_one(by_account[account], drained):
                        per_account[account] += 1
                        room -= 1
                        leased = True

    async def _lease_one(self, docs: list[Doc], drained: set[str]) -> bool:
        for doc in docs:
            if doc["id"] in drained:
                continue
            indexes = await self._store.lease(doc["id"], self.owner, 1, self._settings.lease_seconds)
            if indexes:
                self._start(doc, indexes[0])
                return True
            drained.add(doc["id"])
        return False

    def _start(self, doc: Doc, index: int) -> None:
        slot = (doc["id"], index)
        self._running[slot] = asyncio.create_task(self._run(doc, index))
        self._running[slot].add_done_callback(lambda _: self._running.pop(slot, None))

    async def _run(self, doc: Doc, index: int) -> None:
        batch_id = doc["id"]
        renewal = asyncio.create_task(self._renew(batch_id, index))
        try:
            result = await self._answer(doc, index)
            if result is None:
                await self._store.postpone(batch_id, self.owner, index, self._settings.retry_delay)
                self._metrics.lines.labels("retried").inc()
            elif await self._store.record(result, batch_id):
                self._metrics.lines.labels("answered" if result.ok else "failed").inc()
            self._crashes.pop((batch_id, index), None)
        except Exception:
            log.exception("batch %s line %d failed to run", batch_id, index)
            await self._after_crash(batch_id, index)
        finally:
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal

    async def _after_crash(self, batch_id: str, index: int) -> None:
        """Tries the line again soon, and fails it once it has raised CRASH_LIMIT times here: a line that always
        breaks the path must not hold its batch open until the window ends."""
        slot = (batch_id, index)
        crashes = self._crashes.pop(slot, 0) + 1
        with contextlib.suppress(Exception):  # a store outage: the lease lapses and the line runs again
            if crashes < CRASH_LIMIT:
                self._crashes[slot] = crashes
                await self._store.postpone(batch_id, self.owner, index, self._settings.retry_delay)
                return
            line = (self._lines.get(batch_id) or {}).get(index)
            failure = error_line(None if line is None else line.custom_id, "line_crashed",
                                 f"the gateway failed to run this line {crashes} times; its log says why")
            if await self._store.record(LineResult(index, False, json.dumps(failure)), batch_id):
                self._metrics.lines.labels("failed").inc()

    async def _answer(self, doc: Doc, index: int) -> LineResult | None:
        """The line's result, or None when it is to be tried again later."""
        line = (await self._read(doc) or {}).get(index)
        if line is None:
            failure = error_line(None, "input_file_missing", "the batch's input file was deleted before this line ran")
            return LineResult(index, False, json.dumps(failure))
        verdict = await self._quota.key_by_id(doc["key_id"])
        if verdict.reason == "store_unavailable":
            return None
        if not verdict.ok or verdict.key is None:
            failure = error_line(line.custom_id, f"key_{verdict.reason}", f"the batch's API key is {verdict.reason}")
            return LineResult(index, False, json.dumps(failure))
        answered = await self._runner.run(doc["endpoint"], line, verdict.key)
        if answered.retry_later:
            return None
        return _result(line, answered)

    async def _renew(self, batch_id: str, index: int) -> None:
        while True:
            await asyncio.sleep(self._settings.lease_seconds / 3)
            with contextlib.suppress(Exception):  # a missed renewal is retried; only a lapse loses the line
                await self._store.renew(batch_id, self.owner, [index], self._settings.lease_seconds)

    async def _read(self, doc: Doc) -> dict[int, Line] | None:
        if doc["id"] not in self._lines:
            content = await self._folder.read(doc["input_file_id"])
            read = None if content is None else await asyncio.to_thread(read_lines, content, doc["endpoint"],
                                                                        self._settings.max_line_bytes)
            self._lines[doc["id"]] = None if read is None else {line.index: line for line in read.lines}
        return self._lines[doc["id"]]

    def _runs(self, batch_id: str) -> bool:
        return any(b == batch_id for b, _ in self._running)

    def _end(self, doc: Doc, outcome: str, claimed: bool = False) -> None:
        self._ending.add(doc["id"])
        task = asyncio.create_task(self._finish(doc, outcome, claimed))
        task.add_done_callback(lambda _: self._ending.discard(doc["id"]))

    async def _finish(self, doc: Doc, outcome: str, claimed: bool) -> None:
        try:
            claim = doc if claimed else await self._finalizer.begin(doc, outcome)
            if claim is not None:
                lines = await self._read(doc) or {}
                await self._finalizer.finish(claim, {i: line.custom_id for i, line in lines.items()})
        except Exception:
            log.exception("ending batch %s failed; it is tried again", doc["id"])

    def _forget_ended(self, active: set[str]) -> None:
        for batch_id in [b for b in self._lines if b not in active]:
            del self._lines[batch_id]


def _result(line: Line, answered: Answered) -> LineResult:
    """An answer for the output file; a refusal or an upstream error, whole, for the error file."""
    response = {"status_code": answered.status, "request_id": answered.request_id, "body": answered.body}
    return LineResult(line.index, answered.status < 300, json.dumps({
        "id": answered.request_id, "custom_id": line.custom_id, "response": response, "error": None}))
