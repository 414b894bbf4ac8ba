"""Settings for every tier, from defaults, an optional YAML file, `TIDEGATE_*` variables and flags."""

from config.autoscale import AutoscaleSettings
from config.backend import BackendSettings, EngineSettings
from config.gateway import (
    REQUEST_EXTRAS,
    Breaker,
    Channel,
    GatewaySettings,
    IpRateLimit,
    ModelLimits,
    PriorityClass,
    RequestExtra,
    Retries,
    ServerLimits,
    Timeouts,
    TokenBucket,
    Tracing,
)
from config.model_groups import ModelGroup, Routing, Target
from config.settings import Settings, SettingsError, load_settings
from config.stores import OnRedisDown, RedisDownPolicy, StoreSettings

__all__ = [
    "REQUEST_EXTRAS",
    "AutoscaleSettings",
    "BackendSettings",
    "Breaker",
    "Channel",
    "EngineSettings",
    "GatewaySettings",
    "IpRateLimit",
    "ModelGroup",
    "ModelLimits",
    "OnRedisDown",
    "PriorityClass",
    "RedisDownPolicy",
    "RequestExtra",
    "Retries",
    "Routing",
    "ServerLimits",
    "Settings",
    "SettingsError",
    "StoreSettings",
    "Target",
    "Timeouts",
    "TokenBucket",
    "Tracing",
    "load_settings",
]
