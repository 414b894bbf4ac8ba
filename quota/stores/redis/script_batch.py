"""Sends concurrent Lua script calls to Redis together: each call stays one EVALSHA, many share one write.

Admissions that arrive while a batch is in flight wait for the next one, so batches grow with load and
a burst of thousands costs a few writes instead of thousands of connections. Commands are packed here
(a key's script keys are packed once, see `PackedKeys`) and written on a pooled redis-py connection, which
keeps doing the handshake, TLS, timeouts and reply parsing. On a Redis Cluster a batch is a cluster pipeline
instead: redis-py splits it by node (each call's keys lie in one slot) and follows MOVED and ASK.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from redis.asyncio import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    NoScriptError,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError,
)

from limiter import REDIS_DOWN
from quota.stores.redis.client import RedisClient

MAX_BATCH = 512
# a node out of reach or a slot without its master: the client's slot map may be stale (a failover)
TOPOLOGY_ERRORS = (ConnectionError, TimeoutError, ClusterDownError, SlotNotCoveredError)


def _bulk(value: str | bytes | int | float) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


class PackedKeys:
    """Script keys in wire form, packed once and reused by every call that names them."""

    __slots__ = ("count", "names", "wire")

    def __init__(self, keys: Sequence[str]) -> None:
        self.count = len(keys)
        self.names = tuple(keys)  # a cluster client routes each call by its keys' slot
        self.wire = b"".join(_bulk(k) for k in keys)


_Call = tuple[AsyncScript, PackedKeys, Sequence[Any], "asyncio.Future[Any]"]


def _pack(script: AsyncScript, keys: PackedKeys, args: Sequence[Any]) -> bytes:
    head = b"*%d\r\n$7\r\nEVALSHA\r\n" % (3 + keys.count + len(args))
    return head + _bulk(script.sha) + _bulk(keys.count) + keys.wire + b"".join(_bulk(a) for a in args)


class ScriptBatcher:
    def __init__(self, client: RedisClient, in_flight: int = 2) -> None:
        self._client = client
        self._queue: list[_Call] = []
        self._senders: set[asyncio.Task[None]] = set()
        self._in_flight = in_flight

    async def call(self, script: AsyncScript, keys: PackedKeys | Sequence[str], args: Sequence[Any]) -> Any:
        """Runs `script` as part of the next batch; raises what Redis or the connection raised."""
        packed = keys if isinstance(keys, PackedKeys) else PackedKeys(keys)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((script, packed, args, future))
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
        results = await self._write(batch)
        missing = [n for n, result in enumerate(results) if isinstance(result, NoScriptError)]
        if missing:  # a restarted or flushed Redis: load each script once, then resend what failed
            for script in {id(batch[n][0]): batch[n][0] for n in missing}.values():
                await self._client.script_load(script.script)
            again = await self._write([batch[n] for n in missing])
            for n, result in zip(missing, again, strict=True):
                results[n] = result
        return results

    async def _write(self, batch: list[_Call]) -> list[Any]:
        """One write of the whole batch, then its replies in order (an error reply stays in its place)."""
        if isinstance(self._client, RedisCluster):
            return await _write_to_cluster(self._client, batch)
        pool = self._client.connection_pool
        connection = await pool.get_connection()
        try:
            await connection.send_packed_command(b"".join(_pack(s, k, a) for s, k, a, _ in batch),
                                                 check_health=False)
            results: list[Any] = []
            for _ in batch:
                try:
                    results.append(await connection.read_response())
                except ResponseError as exc:
                    results.append(exc)
            return results
        except BaseException:
            await connection.disconnect()  # replies may be left unread: the connection cannot be reused
            raise
        finally:
            await pool.release(connection)


async def _write_to_cluster(client: RedisCluster, batch: list[_Call]) -> list[Any]:
    """The batch as one cluster pipeline: one write per node, replies in order, errors in their places."""
    pipe = client.pipeline(transaction=False)
    for script, keys, args, _ in batch:
        # redis-py blocks pipe.evalsha on a cluster (a keyless script has no slot); every call here has keys
        pipe.execute_command("EVALSHA", script.sha, keys.count, *keys.names, *args)
    try:
        results = list(await pipe.execute(raise_on_error=False))
    except TOPOLOGY_ERRORS:
        await _reread_slots(client)
        raise
    if any(isinstance(result, TOPOLOGY_ERRORS) for result in results):
        await _reread_slots(client)
    return results


async def _reread_slots(client: RedisCluster) -> None:
    """The store fails fast, without redis-py's retries, which are what re-read the slot map after a failover:
    so read it here, and the next try goes to the replica that took over. Other nodes' connections stay."""
    with contextlib.suppress(*REDIS_DOWN):
        await client.nodes_manager.initialize()
