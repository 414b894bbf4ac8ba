"""Named records of one kind (MCP servers) in each store: seeded once per kind, every write moves the kind's
version, and kinds do not see each other's records."""

from __future__ import annotations

import asyncio

from config.stores import StoreSettings
from quota import open_record_store

SERVER = {"name": "alpha", "url": "http://127.0.0.1:1/mcp"}


async def test_a_kind_is_seeded_once_and_each_write_moves_its_version(settings: StoreSettings) -> None:
    replicas = [open_record_store(settings, "mcp_servers") for _ in range(3)]
    other = open_record_store(settings, "something_else")
    try:
        seeded = await asyncio.gather(*(r.seed({"alpha": SERVER}) for r in replicas))
        assert sorted(seeded) == [False, False, True]
        store = replicas[0]
        first = await store.snapshot()
        assert first.records == {"alpha": SERVER} and first.version == 1
        assert not await store.seed({"beta": SERVER})  # a later start with another file changes nothing
        await store.put("beta", {**SERVER, "name": "beta"})
        assert set((await replicas[1].snapshot()).records) == {"alpha", "beta"} and await replicas[1].version() == 2
        await store.delete("alpha")
        after = await replicas[2].snapshot()
        assert set(after.records) == {"beta"} and after.version == 3
        assert (await other.snapshot()).records == {} and await other.seed({})  # its own kind, seeded apart
    finally:
        for replica in [*replicas, other]:
            await replica.close()
