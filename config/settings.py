"""The root settings object: defaults < YAML file < `TIDEGATE_*` environment < command-line flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from config.autoscale import AutoscaleSettings
from config.backend import BackendSettings
from config.gateway import GatewaySettings
from config.url_credentials import redact_url


class SettingsError(Exception):
    """Invalid settings; the message names each bad field and value, one per line."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TIDEGATE_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    model_dir: Path = Field(default=Path("~/.cache/tidegate/models"))
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    backend: BackendSettings = Field(default_factory=BackendSettings)
    autoscale: AutoscaleSettings = Field(default_factory=AutoscaleSettings)

    def resolved_model_dir(self) -> Path:
        return self.model_dir.expanduser()


class _YamlSection(PydanticBaseSettingsSource):
    """Reads a YAML file as the contents of one section (`gateway` or `backend`)."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]):
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self._data


def read_yaml(path: Path, section: str) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise SettingsError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise SettingsError(f"config file {path} must hold a mapping of settings, not {type(raw).__name__}")
    return {section: raw}


def load_settings(
    config_file: Path | str | None = None,
    section: str = "gateway",
    overrides: dict[str, Any] | None = None,
) -> Settings:
    """Build the settings, or raise SettingsError naming every bad field and its value."""
    file_data = read_yaml(Path(config_file), section) if config_file else {}

    class _Loaded(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, _YamlSection(settings_cls, file_data))

    try:
        return _Loaded(**(overrides or {}))
    except ValidationError as exc:
        raise SettingsError(format_errors(exc)) from None


def format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"]) or "settings"
        env = "TIDEGATE_" + "__".join(str(p).upper() for p in err["loc"] if not isinstance(p, int))
        value = err.get("input")
        if isinstance(value, str) and "://" in value:
            value = redact_url(value)  # a bad base_url or redis_url may carry a password
        shown = repr(value) if not isinstance(value, dict) else "{...}"
        lines.append(f"invalid setting {field} = {shown}: {err['msg']} (file key or env {env})")
    return "\n".join(lines)
