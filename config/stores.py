"""Where the gateway keeps its state, and what it does when that state is out of reach."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from config.redis_url import cluster_url


class OnRedisDown(StrEnum):
    """What a limit class does while Redis cannot be reached."""

    fail_closed = "fail_closed"  # refuse with 503
    local = "local"  # enforce a local limit divided by the number of gateway replicas
    fail_open = "fail_open"  # admit without limit


class RedisDownPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Budgets and auth are money and security: they never degrade silently.
    budgets: OnRedisDown = OnRedisDown.fail_closed
    auth: OnRedisDown = OnRedisDown.fail_closed
    rate_limits: OnRedisDown = OnRedisDown.local
    concurrency: OnRedisDown = OnRedisDown.local


class AdminLimits(BaseModel):
    """Bounds on what admin callers may write, so that no admin key (an account admin's included) grows the store
    without limit."""

    model_config = ConfigDict(extra="forbid")

    writes_per_minute: int = Field(default=240, ge=1)  # per admin identity, every replica together; then 429
    keys_per_account: int = Field(default=1000, ge=1)  # live keys (revoked ones do not count)
    sub_accounts_per_account: int = Field(default=200, ge=1)


class StoreSettings(BaseModel):
    """Shared by every gateway replica: the embedded SQLite store, or Redis when `redis_url` is set."""

    model_config = ConfigDict(extra="forbid")

    redis_url: str | None = None
    data_dir: Path = Field(default=Path("~/.local/share/tidegate"))
    redis_down: RedisDownPolicy = Field(default_factory=RedisDownPolicy)
    # Used to divide rate limits when degrading to local limits while Redis is down.
    gateway_replicas: int = Field(default=1, ge=1)
    redis_timeout: float = Field(default=0.5, gt=0)
    # A reservation's concurrency lease lapses this long after admission or its last renew (crashed gateway).
    lease_ttl: float = Field(default=30.0, gt=0)
    # Auth answers are cached this long; revocation is visible everywhere within it.
    auth_cache_ttl: float = Field(default=1.0, ge=0, le=1.0)
    # While Redis is down, how often one call tries it again to recover.
    redis_retry_interval: float = Field(default=0.5, gt=0)
    # Audit log entries (admin changes) older than this are dropped as new ones arrive.
    audit_retention_days: float = Field(default=365.0, gt=0)
    # Per-request records (ids, tokens, cost, outcome; never content) are kept this many days; 0: none.
    request_records_retention_days: int = Field(default=30, ge=0, le=3660)
    admin_limits: AdminLimits = Field(default_factory=AdminLimits)

    @field_validator("redis_url")
    @classmethod
    def _cluster_seeds_parse(cls, url: str | None) -> str | None:
        if url is not None:
            cluster_url(url)  # a malformed seed list fails at start-up, not at the first request
        return url

    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser()
