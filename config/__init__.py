"""Settings for every tier, from defaults, an optional YAML file, `TIDEGATE_*` variables and flags."""

from config.backend import BackendSettings, EngineSettings
from config.gateway import Breaker, Channel, GatewaySettings, PriorityClass, Retries, Timeouts, Tracing
from config.settings import Settings, SettingsError, load_settings
from config.stores import OnRedisDown, RedisDownPolicy, StoreSettings

__all__ = [
    "BackendSettings",
    "Breaker",
    "Channel",
    "EngineSettings",
    "GatewaySettings",
    "OnRedisDown",
    "PriorityClass",
    "RedisDownPolicy",
    "Retries",
    "Settings",
    "SettingsError",
    "StoreSettings",
    "Timeouts",
    "Tracing",
    "load_settings",
]
