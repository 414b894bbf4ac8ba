"""Tenancy (accounts, sub-accounts, keys), quotas, atomic admission, settlement and the usage ledger."""

from quota.admin.accounts import UNSET, QuotaAdmin, hash_secret
from quota.records import (
    Account,
    Admission,
    ApiKey,
    AuthResult,
    Bucket,
    CreatedKey,
    InvalidRequest,
    KeyInfo,
    Level,
    LimitName,
    NotFound,
    Quota,
    RateInfo,
    Reservation,
    SubAccount,
    UsageReport,
    UsageRow,
)
from quota.service import QuotaService
from quota.stores.open import open_routing_store, open_store
from quota.stores.redis.client import RedisClient, open_redis
from quota.stores.routing_store import RoutingSnapshot, RoutingStore

__all__ = [
    "UNSET",
    "Account",
    "Admission",
    "ApiKey",
    "AuthResult",
    "Bucket",
    "CreatedKey",
    "InvalidRequest",
    "KeyInfo",
    "Level",
    "LimitName",
    "NotFound",
    "Quota",
    "QuotaAdmin",
    "QuotaService",
    "RateInfo",
    "RedisClient",
    "Reservation",
    "RoutingSnapshot",
    "RoutingStore",
    "SubAccount",
    "UsageReport",
    "UsageRow",
    "hash_secret",
    "open_redis",
    "open_routing_store",
    "open_store",
]
