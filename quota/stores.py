"""Opens the store that StoreSettings names: Redis when `redis_url` is set, else the embedded one."""

from __future__ import annotations

from config.stores import StoreSettings
from quota.embedded import DB_NAME, EmbeddedQuotaService
from quota.routing_store import RoutingStore
from quota.service import QuotaService
from quota.sqlite_routing import SqliteRouting


async def open_store(settings: StoreSettings) -> QuotaService:
    if settings.redis_url:
        from quota.redis_store import RedisQuotaService

        return await RedisQuotaService.open(settings)
    return EmbeddedQuotaService(settings)


def open_routing_store(settings: StoreSettings) -> RoutingStore:
    """Channel and model-group records, in the same store as the tenancy records."""
    if settings.redis_url:
        from quota.redis_client import open_redis
        from quota.redis_routing import RedisRouting

        return RedisRouting(open_redis(settings.redis_url, timeout=settings.redis_timeout))
    return SqliteRouting(settings.resolved_data_dir() / DB_NAME)
