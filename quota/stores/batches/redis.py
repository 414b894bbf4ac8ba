"""File and batch records and batch lines in Redis.

Records share one hash tag, so that a record and the indexes that list it change in one script; each batch's
lines have a tag of their own: a sorted set of unanswered lines scored by when each is free again (0: never
leased), a hash of who leased each, and a hash of results written with HSETNX, so a line is answered once.
Times are the server's (`TIME`), so replicas with skewed clocks agree on when a lease lapses.
"""

from __future__ import annotations

import json
from typing import Any, cast

from quota.stores.batches.store import ACTIVE, Doc, LineResult, Progress
from quota.stores.redis.client import RedisClient

DOCS, STATUS, ACTIVE_SET = "tg:{batches}:docs", "tg:{batches}:status", "tg:{batches}:active"
FILES = "tg:{batches}:files"
NOW_MS = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)"

PUT = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
if KEYS[3] then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
  if ARGV[5] == '1' then redis.call('SADD', KEYS[4], ARGV[1]) end
end
"""
# compare-and-set on the status, which every change of a batch's record is
UPDATE = """
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
if ARGV[5] == '1' then redis.call('SADD', KEYS[3], ARGV[1]) else redis.call('SREM', KEYS[3], ARGV[1]) end
return 1
"""
LEASE = NOW_MS + """
local free = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, index in ipairs(free) do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), index)
  redis.call('HSET', KEYS[2], index, ARGV[1])
end
return free
"""
# renew (ARGV[3] = '0') or postpone (ARGV[3] = '1': the owner lets go) the owner's own leases
RENEW = NOW_MS + """
for i = 4, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[1] then
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[i])
    if ARGV[3] == '1' then redis.call('HDEL', KEYS[2], ARGV[i]) end
  end
end
"""
RECORD = """
if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[4], ARGV[3], 1)
return 1
"""
PROGRESS = NOW_MS + """
local running = 0
for _, index in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
  if redis.call('HEXISTS', KEYS[2], index) == 1 then running = running + 1 end
end
return {redis.call('ZCARD', KEYS[1]), running, redis.call('HGET', KEYS[3], 'completed') or 0,
        redis.call('HGET', KEYS[3], 'failed') or 0}
"""


def line_keys(batch_id: str) -> list[str]:
    base = f"tg:{{batch:{batch_id}}}"
    return [f"{base}:lines", f"{base}:owners", f"{base}:results", f"{base}:counts"]


class RedisBatches:
    def __init__(self, client: RedisClient) -> None:
        self._r = client
        self._put, self._update = client.register_script(PUT), client.register_script(UPDATE)
        self._lease, self._renew = client.register_script(LEASE), client.register_script(RENEW)
        self._record, self._progress = client.register_script(RECORD), client.register_script(PROGRESS)

    async def put_file(self, doc: Doc) -> None:
        await self._put(keys=[FILES, _index("files", doc["account_id"])],
                        args=[doc["id"], json.dumps(doc), doc["created_at"]])

    async def get_file(self, file_id: str) -> Doc | None:
        return _doc(await self._r.hget(FILES, file_id))

    async def list_files(self, account_id: str) -> list[Doc]:
        return await self._listed(FILES, _index("files", account_id))

    async def delete_file(self, file_id: str) -> bool:
        doc = await self.get_file(file_id)
        if doc is None:
            return False
        async with self._r.pipeline(transaction=True) as pipe:  # one slot: the records' tag
            pipe.hdel(FILES, file_id)
            pipe.zrem(_index("files", doc["account_id"]), file_id)
            deleted, _ = await pipe.execute()
        return bool(deleted)

    async def create_batch(self, doc: Doc, lines: list[int], results: list[LineResult]) -> None:
        # the lines first: a batch record is never seen without them (a crash in between leaves unlisted keys)
        waiting, _, done, counts = line_keys(doc["id"])
        async with self._r.pipeline(transaction=True) as pipe:
            for start in range(0, len(lines), 1000):
                pipe.zadd(waiting, {str(i): 0 for i in lines[start:start + 1000]})
            if results:
                pipe.hset(done, mapping={str(r.index): _stored(r) for r in results})
                failed = sum(1 for r in results if not r.ok)
                pipe.hset(counts, mapping={"completed": len(results) - failed, "failed": failed})
            await pipe.execute()
        await self._put(keys=[DOCS, _index("batches", doc["account_id"]), STATUS, ACTIVE_SET],
                        args=[doc["id"], json.dumps(doc), doc["created_at"], doc["status"],
                              int(doc["status"] in ACTIVE)])

    async def get_batch(self, batch_id: str) -> Doc | None:
        return _doc(await self._r.hget(DOCS, batch_id))

    async def list_batches(self, account_id: str) -> list[Doc]:
        return await self._listed(DOCS, _index("batches", account_id))

    async def active_batches(self) -> list[Doc]:
        ids = sorted(await self._r.smembers(ACTIVE_SET))
        docs = [_doc(raw) for raw in (await self._r.hmget(DOCS, ids) if ids else [])]
        return sorted((d for d in docs if d is not None), key=lambda d: d["created_at"])

    async def update_batch(self, batch_id: str, expect: frozenset[str], changes: Doc) -> Doc | None:
        doc = await self.get_batch(batch_id)
        if doc is None or doc["status"] not in expect:
            return None
        before = doc["status"]
        doc.update(changes)
        changed = await self._update(keys=[DOCS, STATUS, ACTIVE_SET],
                                     args=[batch_id, before, doc["status"], json.dumps(doc),
                                           int(doc["status"] in ACTIVE)])
        return doc if changed else None

    async def lease(self, batch_id: str, owner: str, count: int, seconds: float) -> list[int]:
        free = await self._lease(keys=line_keys(batch_id)[:2], args=[owner, count, int(seconds * 1000)])
        return [int(i) for i in free]

    async def renew(self, batch_id: str, owner: str, indexes: list[int], seconds: float) -> None:
        if indexes:
            await self._renew(keys=line_keys(batch_id)[:2], args=[owner, int(seconds * 1000), 0, *indexes])

    async def postpone(self, batch_id: str, owner: str, index: int, seconds: float) -> None:
        await self._renew(keys=line_keys(batch_id)[:2], args=[owner, int(seconds * 1000), 1, index])

    async def record(self, result: LineResult, batch_id: str) -> bool:
        outcome = "completed" if result.ok else "failed"
        return bool(await self._record(keys=line_keys(batch_id), args=[result.index, _stored(result), outcome]))

    async def progress(self, batch_id: str) -> Progress:
        waiting, owners, _, counts = line_keys(batch_id)
        unfinished, running, completed, failed = await self._progress(keys=[waiting, owners, counts])
        return Progress(int(unfinished), int(running), int(completed), int(failed))

    async def unfinished(self, batch_id: str) -> list[int]:
        members = cast(list[str], await self._r.zrange(line_keys(batch_id)[0], 0, -1))
        return sorted(int(i) for i in members)

    async def results(self, batch_id: str) -> list[LineResult]:
        stored = cast(dict[str, str], await self._r.hgetall(line_keys(batch_id)[2]))
        return sorted((LineResult(int(i), v[0] == "1", v[1:]) for i, v in stored.items()), key=lambda r: r.index)

    async def close(self) -> None:
        await self._r.aclose()

    async def _listed(self, records: str, index: str) -> list[Doc]:
        ids = cast(list[str], await self._r.zrevrange(index, 0, -1))  # decoded: the client decodes replies
        docs = [_doc(raw) for raw in (await self._r.hmget(records, ids) if ids else [])]
        return [d for d in docs if d is not None]


def _index(kind: str, account_id: str) -> str:
    return f"tg:{{batches}}:{kind}:{account_id}"


def _stored(result: LineResult) -> str:
    return ("1" if result.ok else "0") + result.line


def _doc(raw: Any) -> Doc | None:
    return None if raw is None else dict(json.loads(raw))
