"""Sends concurrent Lua script calls to Redis together: each call stays one EVALSHA, many share one write.

Admissions that arrive while a batch is in flight wait for the next one, so batches grow with load and
a burst of thousands costs a few round trips instead of thousands of connections.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

MAX_BATCH = 512
_Call = tuple[AsyncScript, Sequence[str | bytes], list[Any], "asyncio.Future[Any]"]


class ScriptBatcher:
    def __init__(self, client: Redis, in_flight: int = 2) -> None:
        self._client = client
        self._queue: list[_Call] = []
        self._senders: set[asyncio.Task[None]] = set()
        self._in_flight = in_flight

    async def call(self, script: AsyncScript, keys: Sequence[str | bytes], args: list[Any]) -> Any:
        """Runs `script` as part of the next batch; raises what Redis or the connection raised."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((script, keys, args, future))
        if len(self._senders) < self._in_flight:
            task = asyncio.create_task(self._drain())
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            try:
                results = await self._send(batch)
            except BaseException as exc:  # the whole batch shares the connection's fate
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))
                if not isinstance(exc, Exception):
                    raise
                continue
            for (*_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    async def _send(self, batch: list[_Call]) -> list[Any]:
        results = await self._pipeline(batch)
        missing = [n for n, result in enumerate(results) if isinstance(result, NoScriptError)]
        if missing:  # a restarted or flushed Redis: load each script once, then resend what failed
            for script in {id(batch[n][0]): batch[n][0] for n in missing}.values():
                await self._client.script_load(script.script)
            again = await self._pipeline([batch[n] for n in missing])
            for n, result in zip(missing, again, strict=True):
                results[n] = result
        return results

    async def _pipeline(self, batch: list[_Call]
                        ) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for script, keys, args, _ in batch:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            return list(await pipe.execute(raise_on_error=False))
