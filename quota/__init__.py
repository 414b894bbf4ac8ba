"""Tenancy (accounts, sub-accounts, keys), quotas, atomic admission, settlement and the usage ledger.

The one surface the gateway and the CLI import; the submodules are quota's own."""

from quota.admin.accounts import UNSET, QuotaAdmin, hash_secret
from quota.admin.keys import Role
from quota.money import MICRO, Price, from_micro
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
from quota.rules.audit import AuditEntry
from quota.rules.balance import balance_json
from quota.rules.ip_allowlist import address_allowed
from quota.rules.prices import parse_price, price_json
from quota.rules.quotes import settled_cost
from quota.rules.reports import check_granularity, grouped, parse_group_by, report_csv, report_json
from quota.rules.request_audit import MAX_LISTED
from quota.rules.unit_cost import unit_costs, unit_costs_by_model
from quota.stores.batches.store import BatchStore, LineResult, Progress
from quota.stores.embedded.private_db import connect_private
from quota.stores.embedded.store import DB_NAME
from quota.stores.open import open_batch_store, open_record_store, open_routing_store, open_store
from quota.stores.record_store import RecordSnapshot, RecordStore
from quota.stores.redis.client import RedisClient, open_redis
from quota.stores.routing_store import RoutingSnapshot, RoutingStore
from quota.stores.service import QuotaService

__all__ = [
    "DB_NAME",
    "MAX_LISTED",
    "MICRO",
    "UNSET",
    "Account",
    "Admission",
    "ApiKey",
    "AuditEntry",
    "AuthResult",
    "BatchStore",
    "Bucket",
    "CreatedKey",
    "InvalidRequest",
    "KeyInfo",
    "Level",
    "LimitName",
    "LineResult",
    "NotFound",
    "Price",
    "Progress",
    "Quota",
    "QuotaAdmin",
    "QuotaService",
    "RateInfo",
    "RecordSnapshot",
    "RecordStore",
    "RedisClient",
    "Reservation",
    "Role",
    "RoutingSnapshot",
    "RoutingStore",
    "SubAccount",
    "UsageReport",
    "UsageRow",
    "address_allowed",
    "balance_json",
    "check_granularity",
    "connect_private",
    "from_micro",
    "grouped",
    "hash_secret",
    "open_batch_store",
    "open_record_store",
    "open_redis",
    "open_routing_store",
    "open_store",
    "parse_group_by",
    "parse_price",
    "price_json",
    "report_csv",
    "report_json",
    "settled_cost",
    "unit_costs",
    "unit_costs_by_model",
]
