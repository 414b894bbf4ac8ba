"""Channel and model-group records in Redis: two hashes, the set of draining channels and a version counter."""

from __future__ import annotations

import json
from collections.abc import Callable

from quota.stores.redis.client import RedisClient, RedisPipeline
from quota.stores.routing_store import Record, RoutingSnapshot

# one hash tag: every routing key in one Cluster slot, so a transaction or the seed script may touch them all
CHANNELS, GROUPS = "tg:{routing}:channels", "tg:{routing}:groups"
DRAINING, VERSION, SEEDED = "tg:{routing}:draining", "tg:{routing}:version", "tg:{routing}:seeded"
# atomic, so a replica that loses the race to seed never reads a store marked seeded but still empty
SEED = """
if not redis.call('SET', KEYS[1], '1', 'NX') then return 0 end
for name, body in pairs(cjson.decode(ARGV[1])) do redis.call('HSET', KEYS[2], name, body) end
for name, body in pairs(cjson.decode(ARGV[2])) do redis.call('HSET', KEYS[3], name, body) end
redis.call('INCR', KEYS[4])
return 1
"""


# one consistent read; a script rather than MULTI, whose replies redis-py's cluster transactions cannot parse
SNAPSHOT = """
return {redis.call('GET', KEYS[1]), redis.call('HGETALL', KEYS[2]), redis.call('SMEMBERS', KEYS[3]),
        redis.call('HGETALL', KEYS[4])}
"""


class RedisRouting:
    def __init__(self, client: RedisClient) -> None:
        self._r = client
        self._snapshot = client.register_script(SNAPSHOT)

    async def version(self) -> int:
        return int(await self._r.get(VERSION) or 0)

    async def snapshot(self) -> RoutingSnapshot:
        version, channels, draining, groups = await self._snapshot(keys=[VERSION, CHANNELS, DRAINING, GROUPS])
        return RoutingSnapshot(int(version or 0), _decoded(_pairs(channels)), {_text(n) for n in draining},
                               _decoded(_pairs(groups)))

    async def seed(self, channels: dict[str, Record], groups: dict[str, Record]) -> bool:
        bodies = [json.dumps({name: json.dumps(r) for name, r in records.items()}) for records in (channels, groups)]
        return bool(await self._r.eval(SEED, 4, SEEDED, CHANNELS, GROUPS, VERSION, *bodies))

    async def put_channel(self, name: str, record: Record) -> None:
        await self._write(lambda pipe: (pipe.hset(CHANNELS, name, json.dumps(record)), pipe.srem(DRAINING, name)))

    async def drain_channel(self, name: str) -> None:
        await self._write(lambda pipe: pipe.sadd(DRAINING, name))

    async def delete_channel(self, name: str) -> None:
        await self._write(lambda pipe: (pipe.hdel(CHANNELS, name), pipe.srem(DRAINING, name)))

    async def put_group(self, name: str, record: Record) -> None:
        await self._write(lambda pipe: pipe.hset(GROUPS, name, json.dumps(record)))

    async def delete_group(self, name: str) -> None:
        await self._write(lambda pipe: pipe.hdel(GROUPS, name))

    async def _write(self, change: Callable[[RedisPipeline], object]) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            change(pipe)
            pipe.incr(VERSION)
            await pipe.execute()

    async def close(self) -> None:
        await self._r.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pairs(flat: list[bytes | str]) -> dict[bytes | str, bytes | str]:
    """HGETALL's reply inside a script: names and values in turn."""
    return dict(zip(flat[0::2], flat[1::2], strict=True))


def _decoded(fields: dict[bytes | str, bytes | str]) -> dict[str, Record]:
    return {_text(name): json.loads(value) for name, value in fields.items()}
