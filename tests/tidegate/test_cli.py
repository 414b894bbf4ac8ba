from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tidegate.cli import build_parser
from tidegate.stack.autoscale import ReplicaRange, ScheduleWindow

ROOT = Path(__file__).resolve().parents[2]
SUBCOMMANDS = ["up", "backend", "gateway", "admin", "bench", "model"]


def test_help_lists_every_subcommand() -> None:
    done = subprocess.run([sys.executable, "-m", "tidegate", "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 0
    for name in SUBCOMMANDS:
        assert f"    {name} " in done.stdout


def test_design_flags_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(["backend", "--model", "smollm2", "--served-model-name", "m", "--host", "0.0.0.0",
                              "--port", "9002", "--device", "cpu", "--dtype", "float32", "--max-num-seqs", "8",
                              "--max-num-batched-tokens", "512", "--block-size", "16",
                              "--kv-cache-memory", "256MiB"])
    assert args.port == 9002 and args.kv_cache_memory == "256MiB"
    args = parser.parse_args(["gateway", "--config", "x.yaml", "--host", "h", "--port", "1", "--redis",
                              "redis://r:6379/0", "--workers", "2"])
    assert args.redis_url == "redis://r:6379/0" and args.workers == 2
    args = parser.parse_args(["up", "--replicas", "2", "--port", "8001", "--redis", "redis://r/0"])
    assert args.replicas == ReplicaRange(2, 2) and args.redis == "redis://r/0"
    args = parser.parse_args(["up", "--replicas", "1:3", "--schedule", "08:00-20:00=2", "--scale-up-window", "5"])
    assert args.replicas == ReplicaRange(1, 3) and args.schedule == (ScheduleWindow(480, 1200, 2),)
    assert args.scale_up_window == 5
    assert parser.parse_args(["model", "pull"]).name == "smollm2"


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_commands_parse_with_the_cli() -> None:
    services = _compose()["services"]
    assert {"redis", "gateway", "backend-1", "backend-2"} <= set(services)
    parser = build_parser()
    for name in ("gateway", "backend-1", "backend-2"):
        command = services[name]["command"]
        assert command[0] == "tidegate", name
        args = parser.parse_args(command[1:])  # exits (fails the test) on an unknown flag
        assert args.command == ("gateway" if name == "gateway" else "backend")


def test_compose_wiring_agrees_with_the_gateway_config() -> None:
    from config import load_settings

    services = _compose()["services"]
    gateway_args = build_parser().parse_args(services["gateway"]["command"][1:])
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["gateway"]["volumes"]}
    host_file = ROOT / mounts[str(gateway_args.config)]
    settings = load_settings(host_file)
    for channel in settings.gateway.channels:
        host, port = channel.base_url.split("//")[1].split("/")[0].split(":")
        backend_args = build_parser().parse_args(services[host]["command"][1:])
        assert backend_args.port == int(port) and backend_args.host == "0.0.0.0"
        assert "smollm2" in channel.models
    redis_url = services["gateway"]["environment"]["TIDEGATE_GATEWAY__REDIS_URL"]  # with the password's variable
    assert redis_url.startswith("redis://:${TIDEGATE_REDIS_PASSWORD") and redis_url.endswith("@redis:6379/0")
    for name in ("gateway", "backend-1", "backend-2"):
        assert "/health" in " ".join(services[name]["healthcheck"]["test"])
        assert services[name]["restart"] == "unless-stopped"
    assert "redis-data" in _compose()["volumes"]


def test_dockerfile_pins_torch_and_bakes_the_model_and_the_kernel() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "torch==2.13.0" in text and "tidegate model pull smollm2" in text
    assert "python -m backend.executor.cpu.block_kernel build" in text and "TIDEGATE_KERNEL_DIR=" in text
    for package in ("tidegate", "gateway", "backend", "limiter", "quota", "config", "bench"):
        assert f"COPY {package} ./{package}" in text


def test_every_backend_setting_is_a_flag_that_reaches_the_settings() -> None:
    from config import BackendSettings
    from tidegate.cli import settings_from_args

    args = build_parser().parse_args(["backend", "--max-num-seqs", "7", "--kv-cache-memory", "256MiB",
                                      "--no-prefix-caching", "--no-cuda-graphs", "--threads", "3",
                                      "--dtype", "bfloat16", "--served-model-name", "m"])
    settings = settings_from_args(args, "backend", args.setting_fields).backend
    assert (settings.max_num_seqs, settings.kv_cache_memory, settings.threads) == (7, 256 * 1024 * 1024, 3)
    assert not settings.enable_prefix_caching and not settings.cuda_graphs
    assert (settings.dtype, settings.served_model_name) == ("bfloat16", "m")
    assert settings.max_num_batched_tokens == BackendSettings().max_num_batched_tokens  # not given: default
    nested = {"tracing"}  # sections set in YAML or TIDEGATE_BACKEND__... only
    assert set(args.setting_fields) == set(BackendSettings.model_fields) - nested


def test_a_bad_backend_flag_value_exits_with_the_setting_named() -> None:
    done = subprocess.run([sys.executable, "-m", "tidegate", "backend", "--max-num-seqs", "0"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2
    assert "max_num_seqs" in done.stderr


def test_speculative_flags_reach_the_settings_and_a_draft_needs_its_model(capsys: pytest.CaptureFixture) -> None:
    from tidegate.cli import main, settings_from_args

    args = build_parser().parse_args(["backend", "--speculative", "ngram", "--num-speculative-tokens", "3"])
    settings = settings_from_args(args, "backend", args.setting_fields).backend
    assert (settings.speculative, settings.num_speculative_tokens) == ("ngram", 3)
    assert main(["backend", "--speculative", "draft"]) == 2
    assert "--speculative-model" in capsys.readouterr().err
