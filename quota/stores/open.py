"""Opens the store that StoreSettings names: Redis when `redis_url` is set, else the embedded one."""

from __future__ import annotations

from config.stores import StoreSettings
from quota.stores.batches.embedded import SqliteBatches
from quota.stores.batches.store import BatchStore
from quota.stores.embedded.records import SqliteRecords
from quota.stores.embedded.routing import SqliteRouting
from quota.stores.embedded.store import DB_NAME, EmbeddedQuotaService
from quota.stores.record_store import RecordStore
from quota.stores.routing_store import RoutingStore
from quota.stores.service import QuotaService


async def open_store(settings: StoreSettings) -> QuotaService:
    if settings.redis_url:
        from quota.stores.redis.store import RedisQuotaService

        return await RedisQuotaService.open(settings)
    return EmbeddedQuotaService(settings)


def open_routing_store(settings: StoreSettings) -> RoutingStore:
    """Channel and model-group records, in the same store as the tenancy records."""
    if settings.redis_url:
        from quota.stores.redis.client import open_redis
        from quota.stores.redis.routing import RedisRouting

        return RedisRouting(open_redis(settings.redis_url, timeout=settings.redis_timeout))
    return SqliteRouting(settings.resolved_data_dir() / DB_NAME)


def open_batch_store(settings: StoreSettings) -> BatchStore:
    """File and batch records and batch lines, in the same store as the tenancy records."""
    if settings.redis_url:
        from quota.stores.batches.redis import RedisBatches
        from quota.stores.redis.client import open_redis

        return RedisBatches(open_redis(settings.redis_url, timeout=settings.redis_timeout, decode_responses=True))
    return SqliteBatches(settings.resolved_data_dir() / DB_NAME)
def open_record_store(settings: StoreSettings, kind: str) -> RecordStore:
    """Named records of one `kind` (MCP servers), in the same store as the tenancy records."""
    if settings.redis_url:
        from quota.stores.redis.client import open_redis
        from quota.stores.redis.records import RedisRecords

        return RedisRecords(open_redis(settings.redis_url, timeout=settings.redis_timeout), kind)
    return SqliteRecords(settings.resolved_data_dir() / DB_NAME, kind)
