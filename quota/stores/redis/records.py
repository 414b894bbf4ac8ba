"""Named records of one kind in Redis: a hash of JSON bodies, a version counter and a seeded flag."""

from __future__ import annotations

import json

from quota.stores.record_store import Record, RecordSnapshot
from quota.stores.redis.client import RedisClient

# atomic, so a replica that loses the race to seed never reads a kind marked seeded but still empty
SEED = """
if not redis.call('SET', KEYS[1], '1', 'NX') then return 0 end
for name, body in pairs(cjson.decode(ARGV[1])) do redis.call('HSET', KEYS[2], name, body) end
redis.call('INCR', KEYS[3])
return 1
"""
SNAPSHOT = "return {redis.call('GET', KEYS[1]), redis.call('HGETALL', KEYS[2])}"


class RedisRecords:
    def __init__(self, client: RedisClient, kind: str) -> None:
        self._r = client
        # one hash tag per kind: its keys share a Cluster slot, so a script may touch them all
        self._records, self._version, self._seeded = (f"tg:{{{kind}}}:{part}" for part in
                                                      ("records", "version", "seeded"))
        self._snapshot = client.register_script(SNAPSHOT)

    async def version(self) -> int:
        return int(await self._r.get(self._version) or 0)

    async def snapshot(self) -> RecordSnapshot:
        version, flat = await self._snapshot(keys=[self._version, self._records])
        pairs = zip(flat[0::2], flat[1::2], strict=True)
        return RecordSnapshot(int(version or 0), {_text(name): json.loads(body) for name, body in pairs})

    async def seed(self, records: dict[str, Record]) -> bool:
        bodies = json.dumps({name: json.dumps(record) for name, record in records.items()})
        return bool(await self._r.eval(SEED, 3, self._seeded, self._records, self._version, bodies))

    async def put(self, name: str, record: Record) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(self._records, name, json.dumps(record))
            pipe.incr(self._version)
            await pipe.execute()

    async def delete(self, name: str) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hdel(self._records, name)
            pipe.incr(self._version)
            await pipe.execute()

    async def close(self) -> None:
        await self._r.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
