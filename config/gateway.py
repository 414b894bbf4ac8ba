"""Gateway settings: listen address, channels (where models are served), priority classes, timeouts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, IPvAnyNetwork, field_validator, model_validator

from config.batch import BatchSettings
from config.mcp import McpServer
from config.model_groups import ModelGroup, Routing, group_problem
from config.stores import StoreSettings


class Timeouts(BaseModel):
    """Deadlines in seconds for one upstream call; each layer is measured on its own."""

    model_config = ConfigDict(extra="forbid")

    connect: float = Field(default=1.0, gt=0)
    first_token: float = Field(default=30.0, gt=0)
    idle: float = Field(default=10.0, gt=0)
    total: float = Field(default=120.0, gt=0)

    @model_validator(mode="after")
    def _total_is_outermost(self) -> Timeouts:
        for name in ("connect", "first_token", "idle"):
            if getattr(self, name) > self.total:
                raise ValueError(f"timeouts.{name} ({getattr(self, name)}) exceeds timeouts.total ({self.total})")
        return self


class TokenBucket(BaseModel):
    """Tokens per second into a channel or a model, shared by every gateway replica, with a burst."""

    model_config = ConfigDict(extra="forbid")

    rate: float = Field(gt=0)
    burst: int = Field(ge=1)
    # metrics (channels only): refill at the throughput the replicas' /metrics show they serve (with headroom),
    # never below `rate`
    rate_from: Literal["config", "metrics"] = "config"


class ModelLimits(BaseModel):
    """The cluster layer for one public model, across every channel that serves it."""

    model_config = ConfigDict(extra="forbid")

    token_bucket: TokenBucket | None = None
    global_max_concurrency: int | None = Field(default=None, ge=1)

    @field_validator("token_bucket")
    @classmethod
    def _rate_from_config(cls, value: TokenBucket | None) -> TokenBucket | None:
        if value is not None and value.rate_from != "config":
            raise ValueError("rate_from: metrics is for a channel's token_bucket (its replicas report throughput)")
        return value


RequestExtra = Literal["cache_salt", "priority"]
ChannelKindName = Literal["openai", "azure", "anthropic"]
REQUEST_EXTRAS: tuple[RequestExtra, ...] = ("cache_salt", "priority")


class Channel(BaseModel):
    """One upstream server and the models it serves, spoken to in its `kind`'s wire format."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    base_url: str = Field(pattern=r"^https?://")
    kind: ChannelKindName = "openai"
    # azure: the `api-version` query parameter (required); anthropic: the `anthropic-version` header
    api_version: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    # public model name -> upstream model name; a list means the same names.
    models: dict[str, str]
    api_key: str | None = Field(default=None, repr=False)
    # a file holding the api_key (a mounted secret: a tidegate backend's gateway token), read when the gateway
    # starts (config.secret_files.with_channel_keys); config files only, the admin API refuses it
    api_key_file: Path | None = None
    # request extras the upstream accepts; the gateway sets them itself and always drops the client's
    extras: set[RequestExtra] = Field(default_factory=lambda: set(REQUEST_EXTRAS))
    weight: float = Field(default=1.0, gt=0)
    priority: int = Field(default=0, ge=0)
    max_concurrency: int = Field(default=64, ge=1)
    timeouts: Timeouts | None = None
    health_path: str | None = "/health"  # null for upstreams without one (a cloud API)
    # ask for a stream even for a non-streamed client, so `first_token` means the first token and a cut answer is
    # charged what was generated; false for upstreams that cannot stream
    stream_upstream: bool = True
    cost_per_hour: float = Field(default=0.0, ge=0)  # running cost of this channel's replicas, for unit costs
    # the cluster layer: tokens/s into this channel and requests in it, counted across every gateway replica
    token_bucket: TokenBucket | None = None
    global_max_concurrency: int | None = Field(default=None, ge=1)
    embeddings: bool = False  # serves POST /embeddings (not an anthropic channel): only such channels get them

    @field_validator("models", mode="before")
    @classmethod
    def _list_means_same_names(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return {str(name): str(name) for name in value}
        return value

    @field_validator("models")
    @classmethod
    def _not_empty(cls, value: dict[str, str]) -> dict[str, str]:
        if not value:
            raise ValueError("a channel serves at least one model")
        return value

    @field_validator("health_path")
    @classmethod
    def _plain_path(cls, value: str | None) -> str | None:
        # a path only: a query, fragment or other host would turn the probe into an operator-made oracle
        if value is not None and (not re.fullmatch(r"/[A-Za-z0-9._~/-]{0,255}", value) or "//" in value):
            raise ValueError("health_path must be a plain path such as /health: no query, fragment, scheme or host")
        return value

    @model_validator(mode="after")
    def _kind_fields(self) -> Channel:
        if self.api_key_file is not None and self.api_key is not None:
            raise ValueError("set api_key or api_key_file, not both")
        if self.kind == "azure" and self.api_version is None:
            raise ValueError("an azure channel needs api_version (for example 2024-10-21)")
        if self.kind == "openai" and self.api_version is not None:
            raise ValueError("api_version is for azure and anthropic channels")
        if self.kind == "anthropic" and self.embeddings:
            raise ValueError("an anthropic channel cannot serve embeddings: Anthropic's API has none")
        if self.kind != "openai":  # a cloud API: it has no /health, and would refuse tidegate's own extras
            if "extras" not in self.model_fields_set:
                self.extras = set()
            if "health_path" not in self.model_fields_set:
                self.health_path = None
        return self


class PriorityClass(BaseModel):
    """A concurrency pool with a bounded queue in front of it."""

    model_config = ConfigDict(extra="forbid")

    max_concurrency: int = Field(default=64, ge=1)
    queue_size: int = Field(default=256, ge=0)
    queue_timeout: float = Field(default=3.0, gt=0)
    # the `priority` the gateway sends upstream for this class (lower is served first); null: none is sent
    upstream_priority: int | None = Field(default=None, ge=-(2**31), le=2**31)


class Retries(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_attempts: int = Field(default=3, ge=1, le=10)
    backoff_base: float = Field(default=0.05, ge=0)
    backoff_max: float = Field(default=2.0, ge=0)


class Breaker(BaseModel):
    """Circuit breaker per (channel, model)."""

    model_config = ConfigDict(extra="forbid")

    consecutive_failures: int = Field(default=5, ge=1)
    failure_rate: float = Field(default=0.5, gt=0, le=1)
    window: float = Field(default=30.0, gt=0)
    min_requests: int = Field(default=20, ge=1)
    cooldown: float = Field(default=10.0, gt=0)


class Tracing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exporter: Literal["off", "console", "otlp"] = "off"
    otlp_endpoint: str | None = None
    service_name: str = "tidegate-gateway"


class ServerLimits(BaseModel):
    """What a reverse proxy in front would otherwise enforce, per worker process, before auth is known."""

    model_config = ConfigDict(extra="forbid")

    header_timeout: float = Field(default=10.0, gt=0)  # from connect (or the previous answer) to the last header
    body_timeout: float = Field(default=30.0, gt=0)  # to read the whole request body
    keep_alive_timeout: int = Field(default=5, ge=1)  # an idle connection between requests
    max_header_bytes: int = Field(default=32 * 1024, ge=1024)  # request line and headers together
    # open connections; at the cap the longest-idle one makes room, and only when none is idle is it a 503
    max_connections: int = Field(default=2048, ge=1)
    max_json_depth: int = Field(default=64, ge=2)  # nesting of arrays and objects in a JSON body


class ModelPrice(BaseModel):
    """A seed price in currency units per million tokens; prices set through the admin API take precedence."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)  # None: the input price
    output: float = Field(ge=0)


class IpRateLimit(BaseModel):
    """Requests per minute per client address block, counted before authentication."""

    model_config = ConfigDict(extra="forbid")

    rpm: int = Field(ge=1)
    per_cidr_v4: int = Field(default=32, ge=1, le=32)  # prefix length: 32 is one address, 24 a /24 block
    per_cidr_v6: int = Field(default=64, ge=1, le=128)
    # the older spelling of the gateway's `trusted_proxies`, which it adds to
    trusted_proxies: list[IPvAnyNetwork] = Field(default_factory=list)


def _default_classes() -> dict[str, PriorityClass]:
    return {
        "realtime": PriorityClass(max_concurrency=64, queue_size=256, queue_timeout=3.0, upstream_priority=0),
        "batch": PriorityClass(max_concurrency=16, queue_size=1024, queue_timeout=60.0, upstream_priority=1),
    }


class GatewaySettings(StoreSettings):
    """Accounts and keys are data (admin API); channels and models are config (this file)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=1)
    # the policy (32+ characters, no example value) is checked at start, so an error never echoes the key
    admin_key: str | None = Field(default=None, repr=False)
    admin_key_file: Path | None = None
    channels: list[Channel] = Field(default_factory=list)
    priority_classes: dict[str, PriorityClass] = Field(default_factory=_default_classes)
    default_priority_class: str = "realtime"
    timeouts: Timeouts = Field(default_factory=Timeouts)
    retries: Retries = Field(default_factory=Retries)
    breaker: Breaker = Field(default_factory=Breaker)
    health_check_interval: float = Field(default=5.0, gt=0)
    health_check_timeout: float = Field(default=2.0, gt=0)
    # consecutive failed probes before a channel is taken out: one slow probe under load is not an outage
    unhealthy_threshold: int = Field(default=3, ge=1)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # reserved at admission and sent upstream for requests without a limit; settlement refunds what was not used
    default_max_tokens: int = Field(default=512, ge=1)
    # prompt tokens counted per input image at admission (OpenAI's rule for a 1024x1024 image in high detail)
    image_prompt_tokens: int = Field(default=765, ge=0)
    tracing: Tracing = Field(default_factory=Tracing)
    server: ServerLimits = Field(default_factory=ServerLimits)
    # the bearer token /metrics requires: this, or the file's; `tidegate gateway` generates one into
    # data_dir/metrics_token when neither is set, unless metrics_public opens /metrics to anyone
    metrics_token: str | None = Field(default=None, min_length=16, repr=False)
    metrics_token_file: Path | None = None
    metrics_public: bool = False
    # the key of the HMAC that turns an account id into its upstream cache_salt; default: a secret generated into
    # data_dir/cache_salt_secret on first start. Replicas behind one balancer should share it (one cache per tenant)
    cache_salt_secret_file: Path | None = None
    metrics_per_account: bool = False  # token and spend series per account and sub-account (ids in /metrics)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")  # ISO 4217 code of every price and budget
    prices: dict[str, ModelPrice] = Field(default_factory=dict)  # seed prices per public model name
    models_limits: dict[str, ModelLimits] = Field(default_factory=dict)  # per public model name
    ip_rate_limit: IpRateLimit | None = None
    # proxies whose X-Forwarded-For is believed (addresses or CIDR blocks), for the IP limit, allowed_ips and the
    # audit alike; none by default, so a client (or any local process) cannot choose the address it is counted as
    trusted_proxies: list[IPvAnyNetwork] = Field(default_factory=list)
    # public model name -> its targets and fallbacks; a channel's `models` map is the group of names not listed here
    model_groups: dict[str, ModelGroup] = Field(default_factory=dict)
    routing: Routing = Field(default_factory=Routing)  # a model group's own `routing` overrides it
    # how long a Responses API response (and the conversation to continue it) is kept for previous_response_id
    responses_ttl_seconds: int = Field(default=86400, ge=60)
    # what one account's stored responses may take (bytes, as stored); past it a request with store: true is a 429
    responses_max_stored_bytes_per_account: int = Field(default=64 * 1024 * 1024, ge=1024)
    batch: BatchSettings = Field(default_factory=BatchSettings)  # the Files and Batch APIs (config/batch.py)
    # MCP servers federated on /mcp (config.mcp); the store's, changed through /admin/mcp-servers, replace them
    mcp_servers: list[McpServer] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> GatewaySettings:
        names = [c.name for c in self.channels]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"channel names must be unique, repeated: {', '.join(duplicated)}")
        servers = [s.name for s in self.mcp_servers]
        if len(set(servers)) != len(servers):
            raise ValueError("mcp_servers names must be unique")
        if self.default_priority_class not in self.priority_classes:
            raise ValueError(
                f"default_priority_class {self.default_priority_class!r} is not one of "
                f"{sorted(self.priority_classes)}"
            )
        implicit = {m for c in self.channels for m in c.models}
        for name, group in self.model_groups.items():
            problem = group_problem(name, group, self.model_groups, names, implicit)
            if problem is not None:
                raise ValueError(f"model_groups.{name}: {problem}")
        if self.metrics_public and (self.metrics_token or self.metrics_token_file):
            raise ValueError("metrics_public opens /metrics to anyone: set it or a metrics token, not both")
        if self.workers > 1 and not self.redis_url:
            raise ValueError("workers > 1 needs redis_url: the embedded store lives in one process")
        return self

    def all_trusted_proxies(self) -> list[IPvAnyNetwork]:
        older = self.ip_rate_limit.trusted_proxies if self.ip_rate_limit is not None else []
        return [*self.trusted_proxies, *older]

    def channel_timeouts(self, channel: Channel) -> Timeouts:
        return channel.timeouts or self.timeouts
