"""Secrets stay off the record: credentials in a channel's URL never reach a log line or `/admin/channels`, and
`--workers N` processes get no secret in their environment."""

from __future__ import annotations

import logging
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import yaml

from config import SettingsError, load_settings
from config.url_credentials import redact_url
from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream
from tests.servers import ChildProcess, RedisServer, free_port, tidegate_argv

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
PASSWORD = "pa55-in-the-url-7d1e"
CHANNEL_KEY = "sk-channel-key-3b9f1c7e5a2d4860"
ADMIN_KEY = "workers-admin-key-9c2e7a4f1b6d8e3a5c0f"


async def test_url_credentials_never_appear_in_logs_or_admin_channels(
        upstreams: Start, gateway_for: StartGateway, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    upstream = await upstreams()
    url = upstream.base_url.replace("http://", f"http://probe:{PASSWORD}@") + f"?api_key={PASSWORD}"
    channel = {"name": "c0", "base_url": url, "models": {"smollm2": "m"}}
    gateway = await gateway_for([], channels=[channel], health_check_interval=0.1)
    deadline = time.monotonic() + 30
    while upstream.health_checks < 3:  # probes ran, and were logged by the HTTP client at INFO
        assert time.monotonic() < deadline, "no health probes"
        await gateway.admin.get("/health")
    listed = await gateway.admin.get("/admin/channels")
    assert listed.status_code == 200 and PASSWORD not in listed.text
    assert listed.json()["data"][0]["base_url"].startswith("http://***@127.0.0.1:")
    assert any("/health" in record.getMessage() for record in caplog.records)
    assert not any(PASSWORD in record.getMessage() for record in caplog.records)
    assert (await gateway.admin.get("/health")).json()["healthy_channels"] == 1  # the probe still authenticates


def test_redaction_covers_user_password_and_secret_query_values() -> None:
    assert redact_url("https://u:p@api.example.com:8443/v1?api-version=2024&key=abc") == (
        "https://***@api.example.com:8443/v1?api-version=2024&key=***")
    assert redact_url("http://127.0.0.1:9001/v1") == "http://127.0.0.1:9001/v1"


def test_a_settings_error_does_not_echo_a_password_in_a_url(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({"channels": [{"name": "a", "base_url": f"ftp://u:{PASSWORD}@h/v1",
                                                    "models": ["m"]}]}))
    with pytest.raises(SettingsError) as refused:
        load_settings(config)
    assert "base_url" in str(refused.value) and PASSWORD not in str(refused.value)


def _worker_pids(parent: int) -> list[int]:
    """uvicorn's worker processes: the server's children started by multiprocessing's spawn."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(pid) for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]


def test_workers_get_no_secret_in_their_environment(tmp_path: Path, redis_server: RedisServer) -> None:
    port = free_port()
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "workers": 2, "redis_url": redis_server.url, "data_dir": str(tmp_path / "data"),
        "channels": [{"name": "c0", "base_url": "http://127.0.0.1:9/v1", "models": ["m"], "api_key": CHANNEL_KEY,
                      "health_path": None}],
    }))
    gateway = ChildProcess(tidegate_argv("gateway", "--config", str(config)), tmp_path / "gw.log", port,
                           env={"TIDEGATE_GATEWAY__ADMIN_KEY": ADMIN_KEY})
    gateway.start()
    try:
        assert gateway.proc is not None
        deadline = time.monotonic() + 60
        while len(workers := _worker_pids(gateway.proc.pid)) < 2:
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.2)
        admin = httpx.get(f"{gateway.url}/admin/accounts", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert admin.status_code == 200  # the workers know the key, from the file
        for pid in workers:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            assert ADMIN_KEY.encode() not in environ and CHANNEL_KEY.encode() not in environ
            settings_file = Path(dict(line.split(b"=", 1) for line in environ.split(b"\0") if b"=" in line)[
                b"TIDEGATE_GATEWAY_SETTINGS_FILE"].decode())
            assert stat.S_IMODE(settings_file.stat().st_mode) == 0o600
            assert stat.S_IMODE(settings_file.parent.stat().st_mode) == 0o700
        assert ADMIN_KEY not in gateway.log() and CHANNEL_KEY not in gateway.log()
    finally:
        gateway.stop()
    assert not settings_file.exists()  # removed with the server


def test_the_embedded_store_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    # the attack: another local user reads channel api keys and stored conversations from the SQLite file
    port, fresh, older = free_port(), tmp_path / "fresh", tmp_path / "older"
    older.mkdir(mode=0o755)
    (older / "tidegate.sqlite3").touch(mode=0o644)  # as an earlier version (or a lax umask) left it
    for data_dir in (fresh, older):
        config = tmp_path / f"{data_dir.name}.yaml"
        config.write_text(yaml.safe_dump({"port": port, "data_dir": str(data_dir / "store")
                                          if data_dir is fresh else str(data_dir)}))
        gateway = ChildProcess(tidegate_argv("gateway", "--config", str(config)), tmp_path / f"{data_dir.name}.log",
                               port, env={"TIDEGATE_GATEWAY__ADMIN_KEY": ADMIN_KEY})
        gateway.start()
        try:
            admin = {"authorization": f"Bearer {ADMIN_KEY}"}
            channel = {"name": "c0", "base_url": "http://127.0.0.1:9/v1", "models": ["m"], "api_key": CHANNEL_KEY}
            assert httpx.post(f"{gateway.url}/admin/channels", headers=admin, json=channel).status_code == 201
            store = data_dir / "store" if data_dir is fresh else data_dir
            files = sorted(store.glob("tidegate.sqlite3*"))
            assert {f.name for f in files} >= {"tidegate.sqlite3", "tidegate.sqlite3-wal", "tidegate.sqlite3-shm"}
            assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == {f.name: 0o600 for f in files}
            if data_dir is fresh:
                assert stat.S_IMODE(store.stat().st_mode) == 0o700
            else:  # an operator's directory is not changed behind their back, but named at start
                assert "others may list it" in gateway.log()
        finally:
            gateway.stop()


def test_metrics_need_a_token_generated_at_start_and_name_no_account(tmp_path: Path) -> None:
    # the attack: anonymous /metrics listed every account id with its token and spend volumes
    port = free_port()
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({"port": port, "data_dir": str(tmp_path / "data")}))
    gateway = ChildProcess(tidegate_argv("gateway", "--config", str(config)), tmp_path / "gw.log", port,
                           env={"TIDEGATE_GATEWAY__ADMIN_KEY": ADMIN_KEY})
    gateway.start()
    try:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        account = httpx.post(f"{gateway.url}/admin/accounts", headers=admin, json={"name": "acme"}).json()["id"]
        assert httpx.get(f"{gateway.url}/metrics").status_code == 401
        assert httpx.get(f"{gateway.url}/metrics", headers=admin).status_code == 401  # its own token only
        token_file = tmp_path / "data" / "metrics_token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        scraped = httpx.get(f"{gateway.url}/metrics",
                            headers={"authorization": f"Bearer {token_file.read_text().strip()}"})
        assert scraped.status_code == 200 and "tidegate_requests_total" in scraped.text
        assert account not in scraped.text
    finally:
        gateway.stop()
