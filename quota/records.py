"""The records that quota/ hands out: tenancy, keys, quotas, admission answers, reservations, usage."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from quota.errors import InvalidRequest as InvalidRequest  # re-exported: callers import both from here
from quota.errors import NotFound as NotFound
from quota.money import MICRO, Budget, Price


class Level(StrEnum):
    key = "key"
    sub_account = "sub_account"
    account = "account"


class LimitName(StrEnum):
    rpm = "rpm"
    tpm = "tpm"
    concurrency = "concurrency"
    tokens_per_day = "tokens_per_day"
    tokens_per_month = "tokens_per_month"
    budget = "budget"
    balance = "balance"
    request_bucket = "request_bucket"
    token_bucket = "token_bucket"
    unpriced = "unpriced"  # the model has no price, and the account pays with a balance or a budget


QUOTA_FIELDS = ("rpm", "tpm", "max_concurrency", "tokens_per_day", "tokens_per_month")
BUCKET_FIELDS = ("request_bucket", "token_bucket")


@dataclass(slots=True, frozen=True)
class Bucket:
    """A token bucket's settings: `burst` units of capacity refilled at `rate` units per second."""

    rate: float
    burst: int

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, int | float) or not 0 < self.rate < 1e12:
            raise InvalidRequest(f"bucket rate must be a positive number, not {self.rate!r}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or not 0 < self.burst < 2**53:
            raise InvalidRequest(f"bucket burst must be a positive integer, not {self.burst!r}")

    @classmethod
    def from_dict(cls, name: str, data: Any) -> Bucket | None:
        if data is None or isinstance(data, Bucket):
            return data
        if not isinstance(data, dict) or set(data) != {"rate", "burst"}:
            raise InvalidRequest(f"quota.{name} must be an object {{rate, burst}} or null, not {data!r}")
        try:
            return cls(data["rate"], data["burst"])
        except InvalidRequest as error:
            raise InvalidRequest(f"quota.{name}: {error}") from None

    def to_dict(self) -> dict[str, float | int]:
        return {"rate": self.rate, "burst": self.burst}


@dataclass(slots=True, frozen=True)
class Quota:
    """Limits of one level; None means unlimited."""

    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    request_bucket: Bucket | None = None  # requests per second, with a burst
    token_bucket: Bucket | None = None  # tokens per second, with a burst
    budget: Budget | None = None

    def __post_init__(self) -> None:
        for name in QUOTA_FIELDS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InvalidRequest(f"quota.{name} must be a non-negative integer or null, not {value!r}")
        for name in BUCKET_FIELDS:
            if not isinstance(getattr(self, name), Bucket | None):
                raise InvalidRequest(f"quota.{name} must be an object {{rate, burst}} or null")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Quota:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise InvalidRequest(f"quota must be an object, not {type(data).__name__}")
        unknown = set(data) - set(QUOTA_FIELDS) - set(BUCKET_FIELDS) - {"budget"}
        if unknown:
            raise InvalidRequest(f"unknown quota fields: {', '.join(sorted(unknown))}")
        buckets = {name: Bucket.from_dict(name, data[name]) for name in BUCKET_FIELDS if name in data}
        return cls(**{**data, **buckets, "budget": Budget.from_dict(data.get("budget"))})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in QUOTA_FIELDS if getattr(self, name) is not None}
        for name in BUCKET_FIELDS:
            bucket = getattr(self, name)
            if bucket is not None:
                out[name] = bucket.to_dict()
        if self.budget is not None:
            out["budget"] = self.budget.to_dict()
        return out

    def as_list(self) -> list[int | None]:
        return [getattr(self, name) for name in QUOTA_FIELDS]


# account: its keys share one prefix cache; key: each key its own; shared: with every other `shared` account
CACHE_SCOPES = ("account", "key", "shared")


@dataclass(slots=True)
class Account:
    id: str
    name: str
    quota: Quota = field(default_factory=Quota)
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    timezone: str = "UTC"  # where its budgets' days, weeks and months begin
    price_multiplier: float = 1.0  # applied to every price it pays (a discount below 1, a markup above)
    cache_scope: str = "account"  # whose requests may share an upstream prefix cache: CACHE_SCOPES
    # ceilings for every key of the account, set by owners and operators: the models its keys may use (None:
    # every model) and the most important priority class they may run in (None: any class)
    models: list[str] | None = None
    max_priority_class: str | None = None


@dataclass(slots=True)
class SubAccount:
    id: str
    account_id: str
    name: str
    quota: Quota = field(default_factory=Quota)
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(slots=True)
class ApiKey:
    """A key as listed by admin calls; its secret is never kept, only the secret's SHA-256."""

    id: str
    account_id: str
    sub_account_id: str | None = None
    name: str = ""
    models: list[str] | None = None  # None: every model
    quota: Quota = field(default_factory=Quota)
    priority_class: str | None = None
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    allowed_ips: list[str] | None = None  # addresses and CIDR blocks; None: any address
    last_used_at: datetime | None = None  # stamped at most once a minute per gateway process
    prefix: str = ""  # the secret's first characters, so that people can tell keys apart


@dataclass(slots=True)
class CreatedKey:
    """The answer to create_key: the only time the secret is ever shown."""

    key: ApiKey
    secret: str


def listed(models: list[str], model: str) -> bool:
    """Whether an allowlist names the model: by its name, or an MCP tool by its server's `mcp:server__*`."""
    if model in models:
        return True
    server, separator, _ = model.partition("__")
    return model.startswith("mcp:") and bool(separator) and f"{server}__*" in models


@dataclass(slots=True, frozen=True)
class KeyInfo:
    """What the gateway needs to know about an authenticated key."""

    id: str
    name: str
    account_id: str
    sub_account_id: str | None
    models: list[str] | None
    priority_class: str | None
    expires_at: datetime | None
    allowed_ips: tuple[str, ...] | None = None
    cache_scope: str = "account"  # its account's
    class_ceiling: str | None = None  # its account's max_priority_class

    def allows(self, model: str) -> bool:
        return self.models is None or listed(self.models, model)

    def levels(self) -> list[tuple[Level, str]]:
        """The levels an admission with this key passes, key first and account last."""
        return _levels(self.id, self.sub_account_id, self.account_id)

    @classmethod
    def of(cls, key: ApiKey, account: Account | None = None) -> KeyInfo:
        """The key as its account bounds it: only models both allow, the account's class ceiling."""
        models = key.models
        if account is not None and account.models is not None:
            models = [m for m in (account.models if models is None else models) if listed(account.models, m)]
        return cls(key.id, key.name, key.account_id, key.sub_account_id, models, key.priority_class,
                   key.expires_at, None if key.allowed_ips is None else tuple(key.allowed_ips),
                   "account" if account is None else account.cache_scope,
                   None if account is None else account.max_priority_class)


@dataclass(slots=True, frozen=True)
class AuthResult:
    ok: bool
    key: KeyInfo | None = None
    reason: str | None = None  # "unknown" | "revoked" | "expired" | "store_unavailable"


@dataclass(slots=True)
class RateInfo:
    """The tightest level's request and token windows, for OpenAI's x-ratelimit-* headers."""

    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests: float | None = None
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens: float | None = None


@dataclass(slots=True)
class Reservation:
    """What admission charged, so that settlement can replace it with real usage exactly once."""

    id: str  # unique per admission; also the concurrency lease member
    request_id: str
    key_id: str
    sub_account_id: str | None
    account_id: str
    model: str
    estimated_tokens: int
    slot: int  # unix second of admission (server clock): the window slot and the ledger hour
    day: int  # days since epoch, UTC
    month: int  # year * 12 + month - 1
    tpm_levels: tuple[Level, ...] = ()  # levels whose token window holds the estimate
    lease_levels: tuple[Level, ...] = ()  # levels holding a concurrency lease
    budget_levels: tuple[Level, ...] = ()  # levels whose day and month budgets count the estimate
    bucket_levels: tuple[Level, ...] = ()  # levels whose token bucket holds the estimate
    local: bool = False  # admitted by the in-process fallback while Redis was down
    # money: the maximum cost reserved (micro-units), the model's prices in force at admission, the account's
    # multiplier (parts per million), each level's charged budget field ('' when none) and the balance flag
    cost: int = 0
    prices: tuple[Price, ...] = ()
    multiplier: int = MICRO
    budget_fields: tuple[str, ...] = ()
    balance: bool = False

    def levels(self) -> list[tuple[Level, str]]:
        """The charged levels, key first and account last."""
        return _levels(self.key_id, self.sub_account_id, self.account_id)


@dataclass(slots=True)
class Admission:
    admitted: bool
    reservation: Reservation | None = None
    refused_level: Level | None = None
    refused_limit: LimitName | None = None
    retry_after: float | None = None
    rate: RateInfo = field(default_factory=RateInfo)
    degraded: bool = False
    unavailable: bool = False


@dataclass(slots=True)
class UsageRow:
    period_start: datetime
    account_id: str
    sub_account_id: str | None
    key_id: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    requests: int
    cached_tokens: int = 0
    cost: int = 0  # micro-units
    channel: str = ""


@dataclass(slots=True)
class UsageReport:
    rows: list[UsageRow]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    cost: int = 0  # micro-units

    @classmethod
    def of(cls, rows: list[UsageRow]) -> UsageReport:
        return cls(rows, sum(r.prompt_tokens for r in rows), sum(r.completion_tokens for r in rows),
                   sum(r.requests for r in rows), sum(r.cost for r in rows))


def _levels(key_id: str, sub_account_id: str | None, account_id: str) -> list[tuple[Level, str]]:
    middle = [(Level.sub_account, sub_account_id)] if sub_account_id is not None else []
    return [(Level.key, key_id), *middle, (Level.account, account_id)]


T = TypeVar("T", Account, SubAccount, ApiKey)


def to_json(record: Account | SubAccount | ApiKey) -> dict[str, Any]:
    """A JSON-ready dict of a tenancy record (datetimes as ISO 8601, quota as its dict)."""
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, Quota):
            value = value.to_dict()
        out[f.name] = value
    return out


def from_json(cls: type[T], data: dict[str, Any]) -> T:
    values = dict(data)
    values["quota"] = Quota.from_dict(values.get("quota"))
    for name in ("created_at", "expires_at", "revoked_at", "last_used_at"):
        if isinstance(values.get(name), str):
            values[name] = datetime.fromisoformat(values[name])
    return cls(**values)
