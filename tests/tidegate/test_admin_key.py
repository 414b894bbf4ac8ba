"""The admin key policy: the gateway refuses a missing, short or published key; compose, the image and
`tidegate up` generate one and never print it unless asked."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from config import load_settings
from config.admin_key import KNOWN_EXAMPLES, MIN_LENGTH, admin_key_problem
from tests.servers import ChildProcess, free_port, tidegate_argv
from tidegate.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
STRONG_KEY = "k7Hq2Zp9Lm4Xv8Rt3Wn6Yb1Cd5Fg0Jh2Sa"


def _gateway(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    return subprocess.run(tidegate_argv("gateway", "--port", str(free_port()), *args), env={**clean, **env},
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


@pytest.mark.parametrize("key", [None, "change-me-please", "admin-key-of-20-chars", "a" * 40])
def test_gateway_refuses_to_start_with_a_missing_example_short_or_repetitive_admin_key(key: str | None) -> None:
    env = {} if key is None else {"TIDEGATE_GATEWAY__ADMIN_KEY": key}
    done = _gateway(env)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "admin_key" in lines[0] and "TIDEGATE_GATEWAY__ADMIN_KEY" in lines[0]
    if key is not None:
        assert key not in done.stderr and key not in done.stdout  # the refusal never repeats the secret


def test_gateway_starts_with_a_strong_admin_key_from_a_file(tmp_path: Path) -> None:
    key_file = tmp_path / "admin_key"
    key_file.write_text(STRONG_KEY + "\n")
    config = tmp_path / "gw.yaml"
    port = free_port()
    config.write_text(yaml.safe_dump({"port": port, "data_dir": str(tmp_path / "data")}))
    argv = tidegate_argv("gateway", "--config", str(config), "--admin-key-file", str(key_file))
    gateway = ChildProcess(argv, tmp_path / "gw.log", port).start()
    try:
        admin = httpx.get(f"{gateway.url}/admin/accounts", headers={"authorization": f"Bearer {STRONG_KEY}"})
        assert admin.status_code == 200
        assert STRONG_KEY not in gateway.log()
    finally:
        gateway.stop()


def test_admin_key_and_admin_key_file_together_are_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "admin_key"
    key_file.write_text(STRONG_KEY)
    done = _gateway({"TIDEGATE_GATEWAY__ADMIN_KEY": STRONG_KEY, "TIDEGATE_GATEWAY__ADMIN_KEY_FILE": str(key_file)})
    assert done.returncode == 2 and "not both" in done.stderr


def test_every_published_example_is_refused() -> None:
    for key in KNOWN_EXAMPLES:
        assert admin_key_problem(key) is not None, key
    assert admin_key_problem(STRONG_KEY) is None and len(STRONG_KEY) >= MIN_LENGTH


def test_admin_key_command_creates_the_key_once_0600_and_prints_it_only_on_request(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "admin_key"
    first = subprocess.run(tidegate_argv("admin-key", "--file", str(path)), capture_output=True, text=True,
                           cwd=ROOT, timeout=60)
    assert first.returncode == 0
    key = path.read_text().strip()
    assert admin_key_problem(key) is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key not in first.stdout + first.stderr and str(path) in first.stderr
    shown = subprocess.run(tidegate_argv("admin-key", "--file", str(path), "--show"), capture_output=True,
                           text=True, cwd=ROOT, timeout=60)
    assert shown.returncode == 0 and shown.stdout.strip() == key  # kept, not replaced


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_no_fallback_key_and_publishes_on_loopback() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "change-me" not in text and "ADMIN_KEY" not in text  # no key, hence no fallback value, in the file
    services = _compose()["services"]
    gateway = services["gateway"]
    assert not any("ADMIN_KEY" in str(name) for name in gateway.get("environment") or {})
    for mapping in gateway["ports"]:
        assert mapping.startswith("${TIDEGATE_BIND:-127.0.0.1}:"), mapping


def test_compose_init_service_writes_the_key_where_the_gateway_reads_it() -> None:
    services = _compose()["services"]
    init = services["admin-key"]
    args = build_parser().parse_args([*init["entrypoint"][1:], *init["command"]])
    assert init["entrypoint"][0] == "tidegate" and args.command == "admin-key" and not args.show
    gateway = services["gateway"]
    assert gateway["depends_on"]["admin-key"] == {"condition": "service_completed_successfully"}
    gateway_args = build_parser().parse_args(gateway["command"][1:])
    mounts = {v.split(":")[1]: v.split(":")[0] for v in gateway["volumes"]}
    settings = load_settings(ROOT / mounts[str(gateway_args.config)]).gateway
    assert settings.admin_key is None and settings.admin_key_file is not None
    init_volume, init_dir = init["volumes"][0].split(":")[:2]
    assert args.file.parent == Path(init_dir) == settings.admin_key_file.parent
    assert mounts[init_dir] == init_volume and init_volume in _compose()["volumes"]


def test_example_configs_ship_no_admin_key() -> None:
    for name in ("gateway.example.yaml", "gateway.compose.yaml"):
        settings = load_settings(ROOT / "config" / name).gateway
        assert settings.admin_key is None and settings.admin_key_file is not None, name


def test_image_default_command_does_not_print_the_keys() -> None:
    cmd = next(line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD "))
    argv = yaml.safe_load(cmd.removeprefix("CMD "))
    args = build_parser().parse_args(argv[1:])
    assert args.command == "up" and args.show_keys is False


def test_up_banner_names_the_key_files_unless_keys_are_new_or_asked_for(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from tidegate.stack.up import ShownKey, print_banner

    hidden = ShownKey(STRONG_KEY, tmp_path / "admin_key", show=False)
    api = ShownKey("tg-" + STRONG_KEY, tmp_path / "api_key", show=False)
    print_banner("http://127.0.0.1:8000", hidden, api, "smollm2")
    out = capsys.readouterr().out
    assert STRONG_KEY not in out and str(tmp_path / "admin_key") in out and str(tmp_path / "api_key") in out
    print_banner("http://127.0.0.1:8000", ShownKey(STRONG_KEY, tmp_path / "admin_key", show=True), api, "smollm2")
    assert f"admin key: {STRONG_KEY}" in capsys.readouterr().out


def test_up_flags_parse() -> None:
    parser = build_parser()
    assert parser.parse_args(["up"]).show_keys is None
    assert parser.parse_args(["up", "--show-keys"]).show_keys is True
