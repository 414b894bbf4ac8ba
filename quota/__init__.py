"""Tenancy (accounts, sub-accounts, keys), quotas, atomic admission, settlement and the usage ledger."""

from quota.admin import UNSET, QuotaAdmin, hash_secret
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
from quota.stores import open_store

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
    "Reservation",
    "SubAccount",
    "UsageReport",
    "UsageRow",
    "hash_secret",
    "open_store",
]
