"""Opens the store that StoreSettings names: Redis when `redis_url` is set, else the embedded one."""

from __future__ import annotations

from config.stores import StoreSettings
from quota.embedded import EmbeddedQuotaService
from quota.service import QuotaService


async def open_store(settings: StoreSettings) -> QuotaService:
    if settings.redis_url:
        from quota.redis_store import RedisQuotaService

        return await RedisQuotaService.open(settings)
    return EmbeddedQuotaService(settings)
