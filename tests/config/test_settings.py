from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from config import SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("TIDEGATE_"):
            monkeypatch.delenv(name)


def test_defaults_match_design() -> None:
    settings = load_settings()
    assert settings.gateway.port == 8000
    assert settings.backend.block_size == 16
    assert set(settings.gateway.priority_classes) == {"realtime", "batch"}
    assert settings.resolved_model_dir() == Path("~/.cache/tidegate/models").expanduser()


def test_nested_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEGATE_GATEWAY__PORT", "9100")
    monkeypatch.setenv("TIDEGATE_BACKEND__MAX_NUM_SEQS", "7")
    monkeypatch.setenv("TIDEGATE_MODEL_DIR", "/tmp/models-here")
    settings = load_settings()
    assert settings.gateway.port == 9100
    assert settings.backend.max_num_seqs == 7
    assert settings.model_dir == Path("/tmp/models-here")


def test_bad_env_value_names_field_and_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEGATE_GATEWAY__PORT", "abc")
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert "gateway.port" in message and "'abc'" in message and "TIDEGATE_GATEWAY__PORT" in message


def test_yaml_file_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text("port: 8100\nhost: 0.0.0.0\nadmin_key: from-the-file\n")
    assert load_settings(config).gateway.port == 8100
    monkeypatch.setenv("TIDEGATE_GATEWAY__PORT", "8200")
    settings = load_settings(config)
    assert settings.gateway.port == 8200 and settings.gateway.host == "0.0.0.0"
    flagged = load_settings(config, overrides={"gateway": {"port": 8300}})
    assert flagged.gateway.port == 8300 and flagged.gateway.admin_key == "from-the-file"


def test_example_config_is_valid() -> None:
    settings = load_settings(ROOT / "config" / "gateway.example.yaml")
    channel = settings.gateway.channels[0]
    assert channel.models == {"smollm2": "smollm2"}
    assert settings.gateway.channel_timeouts(channel).first_token == 30.0


def test_channel_model_list_means_same_names(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text("channels:\n  - {name: a, base_url: 'http://x/v1', models: [m1, m2]}\n")
    assert load_settings(config).gateway.channels[0].models == {"m1": "m1", "m2": "m2"}


def test_a_cloud_kind_of_channel_is_sent_no_extras_nor_health_probes_unless_told(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text("channels:\n  - {name: a, base_url: 'http://x', models: [m], kind: anthropic}\n"
                      "  - {name: b, base_url: 'http://x', models: [m], kind: azure, api_version: '2024-10-21',"
                      " extras: [priority]}\n  - {name: c, base_url: 'http://x', models: [m]}\n")
    channels = load_settings(config).gateway.channels
    assert [c.extras for c in channels] == [set(), {"priority"}, {"cache_salt", "priority"}]
    assert [c.health_path for c in channels] == [None, None, "/health"]


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("channels:\n  - {name: a, base_url: 'ftp://x', models: [m]}\n", "gateway.channels.0.base_url"),
        ("channels:\n  - {name: a, base_url: 'http://x', models: []}\n", "gateway.channels.0.models"),
        ("channels:\n  - {name: a, base_url: 'http://x', models: [m], kind: azure}\n", "needs api_version"),
        ("channels:\n  - {name: a, base_url: 'http://x', models: [m], api_version: v1}\n", "is for azure"),
        ("channels:\n  - {name: a, base_url: 'http://x', models: [m], kind: anthropic, embeddings: true}\n",
         "cannot serve embeddings"),
        ("channels:\n  - {name: a, base_url: 'http://x', models: [m], kind: bedrock}\n", "gateway.channels.0.kind"),
        ("workers: 2\n", "workers > 1 needs redis_url"),
        ("default_priority_class: gold\n", "gold"),
        ("timeouts: {connect: 5, total: 1}\n", "exceeds timeouts.total"),
        ("unknown_key: 1\n", "gateway.unknown_key"),
        ("- just\n- a list\n", "must hold a mapping"),
        ("port: [unclosed\n", "not valid YAML"),
    ],
)
def test_invalid_files_fail_with_a_clear_message(tmp_path: Path, yaml_text: str, expected: str) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(yaml_text)
    with pytest.raises(SettingsError, match=None) as info:
        load_settings(config)
    assert expected in str(info.value)


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"cannot read config file .*nope\.yaml"):
        load_settings(tmp_path / "nope.yaml")


def test_kv_cache_memory_accepts_units() -> None:
    settings = load_settings(section="backend", overrides={"backend": {"kv_cache_memory": "64MiB"}})
    assert settings.backend.kv_cache_memory == 64 * 1024 * 1024


def test_cli_bad_setting_exits_nonzero_with_one_line() -> None:
    env = {"PATH": "/usr/bin:/bin", "TIDEGATE_GATEWAY__PORT": "abc", "HOME": str(Path.home())}
    done = subprocess.run([sys.executable, "-m", "tidegate", "gateway"], env=env, capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "gateway.port" in lines[0] and "'abc'" in lines[0]
