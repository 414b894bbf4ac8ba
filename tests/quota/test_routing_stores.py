"""Channel and model-group records in each store: seeded once, every write moves the version, drains kept."""

from __future__ import annotations

import asyncio

from config.stores import StoreSettings
from quota import open_routing_store

CHANNEL = {"name": "c", "base_url": "http://127.0.0.1:1/v1", "models": {"m": "m"}}


async def test_the_store_is_seeded_once_however_many_replicas_start_together(settings: StoreSettings) -> None:
    replicas = [open_routing_store(settings) for _ in range(3)]
    try:
        seeded = await asyncio.gather(*(r.seed({"c": CHANNEL}, {}) for r in replicas))
        assert sorted(seeded) == [False, False, True]
        store = replicas[0]
        first = await store.snapshot()
        assert first.channels == {"c": CHANNEL} and first.version == 1
        assert not await store.seed({"other": CHANNEL}, {})  # a later start with another file changes nothing

        await store.put_group("g", {"targets": [{"channel": "c", "model": "m"}], "fallbacks": []})
        await store.drain_channel("c")
        drained = await replicas[1].snapshot()
        assert drained.draining == {"c"} and set(drained.groups) == {"g"} and drained.version == 3
        await store.delete_channel("c")
        assert (await replicas[2].snapshot()).channels == {} and await replicas[2].version() == 4
    finally:
        for replica in replicas:
            await replica.close()
